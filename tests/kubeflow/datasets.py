"""A stand-in for the ``datasets.py`` beside Kubeflow's JAX MNIST example
(``examples/jax/jax-dist-spmd-mnist``), which downloads MNIST: the same
``mnist()``, from data already on this machine, so the example itself runs
unmodified with no network.

The data is scikit-learn's handwritten digits (1,797 images of 8x8, shipped
inside the package), scaled to MNIST's 28x28 (each pixel 3x3, a border of
2), as MNIST's shapes and types: images flattened to 784 floats in [0, 1],
labels one-hot over 10 classes.
"""

import numpy as np
from sklearn.datasets import load_digits

_TRAIN = 1500


def _one_hot(x, k, dtype=np.float32):
    return np.array(x[:, None] == np.arange(k), dtype)


def mnist():
    """(train_images, train_labels, test_images, test_labels), as the
    original's ``mnist()`` returns them."""
    digits = load_digits()
    images = np.repeat(np.repeat(digits.images / 16.0, 3, axis=1), 3, axis=2)
    images = np.pad(images, ((0, 0), (2, 2), (2, 2))).reshape(len(images), 28 * 28).astype(np.float32)
    labels = _one_hot(digits.target, 10)
    return images[:_TRAIN], labels[:_TRAIN], images[_TRAIN:], labels[_TRAIN:]
