"""Reading, with TensorFlow: datasets on disk (`dataset`), the input pipeline (`reader`, with
`records` and `service`), preprocessing shared by training, evaluation and serving
(`preprocess`), strategies (`distribute`), the serving signature (`serving`) and the
TPU-readiness check (`tpu_ready`)."""
