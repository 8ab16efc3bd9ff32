"""The Grain input pipeline (public: `tfrecord_pipe.grain`): ArrayRecord shards through Grain,
preprocessed in numpy and Pillow. Needs no TensorFlow."""
