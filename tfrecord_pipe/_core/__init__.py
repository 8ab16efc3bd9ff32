"""The core: no TensorFlow, no Beam. The record format (`schema`), a dataset folder's files
(`naming`) and manifest (`manifest`), image normalisation (`images`), and small helpers for
paths, progress lines and network probes. The conversion job's workers import only this."""
