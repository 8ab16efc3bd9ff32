"""The Grain input pipeline (public: `tfrecord_pipe.grain`): ArrayRecord shards through Grain,
preprocessed with numpy and OpenCV. Needs no TensorFlow."""
