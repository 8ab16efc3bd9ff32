"""The Grain input pipeline (public: `tfrecord_pipe.grain`): ArrayRecord shards through Grain,
preprocessed with numpy and OpenCV. Needs no TensorFlow.

  source.py    a split's shards as one random-access source, checked against the manifest
  images.py    the reader's preprocessing (crops, DCT scale, resize) in numpy and OpenCV
  pipeline.py  make_dataset: the training stream, padded evaluation, batches
  resume.py    a resumable position that refuses a state of other settings
"""
