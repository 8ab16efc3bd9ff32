"""The `tfrecord-pipe` command (`cli`) and what its commands run: `inspection` (inspect),
`verify` and `bench`; `convert` is the Beam job in `beam_jobs`."""
