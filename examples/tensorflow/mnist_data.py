"""MNIST for the seed's example, without reaching out to the network unasked.

Keras's own tf.keras.datasets.mnist.load_data() is used when its file is already
in Keras's cache (~/.keras/datasets/mnist.npz) or CHORUS_DOWNLOAD=1 allows the
download. Otherwise: scikit-learn's bundled handwritten digits (8x8), scaled to
28x28 and shifted a little to make MNIST's 60,000 training and 10,000 test
images, from disjoint source digits. Same shapes and dtypes as MNIST, a
different (easier-to-get, smaller) dataset: the example says which it used."""
import os

import numpy as np


def _digits_as_mnist():
    from sklearn.datasets import load_digits
    d = load_digits()
    images = (np.kron(d.images, np.ones((3, 3))) * (255.0 / 16.0))  # 8x8 -> 24x24, 0..255
    images = np.pad(images, ((0, 0), (2, 2), (2, 2)))  # 28x28, as MNIST's centred digits
    rng = np.random.default_rng(0)

    def expand(idx, count):
        pick = rng.choice(idx, size=count)
        out = np.empty((count, 28, 28), dtype=np.uint8)
        for i, k in enumerate(pick):
            dy, dx = rng.integers(-2, 3, size=2)
            img = np.roll(images[k], (dy, dx), axis=(0, 1)) * rng.uniform(0.8, 1.0)
            out[i] = np.clip(img + rng.normal(0, 8, size=(28, 28)), 0, 255).astype(np.uint8)
        return out, d.target[pick].astype(np.uint8)

    order = rng.permutation(len(images))
    train_idx, test_idx = order[:1500], order[1500:]
    return expand(train_idx, 60000), expand(test_idx, 10000)


def load_mnist():
    import tensorflow as tf
    cached = os.path.join(os.path.expanduser("~"), ".keras", "datasets", "mnist.npz")
    if os.path.exists(cached) or os.environ.get("CHORUS_DOWNLOAD") == "1":
        print("data: MNIST (tf.keras.datasets.mnist.load_data)", flush=True)
        return tf.keras.datasets.mnist.load_data()
    print("data: offline, so scikit-learn's handwritten digits shaped as MNIST (60000/10000 images of "
          "28x28); set CHORUS_DOWNLOAD=1 to download the real MNIST", flush=True)
    return _digits_as_mnist()
