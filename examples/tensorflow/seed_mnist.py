# The second seed document's TensorFlow example, run by chorus: the import is the
# one change (horovod.tensorflow -> chorus.tensorflow), and the dataset line
# reads MNIST through mnist_data.load_mnist(), which calls Keras's
# tf.keras.datasets.mnist.load_data() when it may and says what it used.
#   PYTHONPATH=build/python ./build/chorusrun -np 2 build/venv-tf/bin/python examples/tensorflow/seed_mnist.py
import tensorflow as tf
import chorus.tensorflow as hvd
from mnist_data import load_mnist

# 1. 初始化 Horovod
hvd.init()

# 2. 配置 GPU
gpus = tf.config.experimental.list_physical_devices('GPU')
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], 'GPU')

# 3. 构建模型
model = tf.keras.models.Sequential([
    tf.keras.layers.Dense(10, activation='relu', input_shape=(784,)),
    tf.keras.layers.Dense(10, activation='softmax')
])

# 4. 定义优化器
optimizer = tf.keras.optimizers.Adam(0.001 * hvd.size())  # 学习率需要根据 GPU 数量进行调整

# 5. 使用 Horovod DistributedOptimizer 封装优化器
optimizer = hvd.DistributedOptimizer(optimizer)

# 6. 定义损失函数和指标
loss_fn = tf.keras.losses.CategoricalCrossentropy()
metrics = ['accuracy']

# 7. 编译模型
model.compile(optimizer=optimizer, loss=loss_fn, metrics=metrics)

# 8. 加载数据集
(x_train, y_train), (x_test, y_test) = load_mnist()  # seed: tf.keras.datasets.mnist.load_data()
x_train = x_train.reshape(60000, 784).astype('float32') / 255
x_test = x_test.reshape(10000, 784).astype('float32') / 255
y_train = tf.keras.utils.to_categorical(y_train, num_classes=10)
y_test = tf.keras.utils.to_categorical(y_test, num_classes=10)

# 9. 使用 Horovod 分布式数据集
dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(10000).batch(128)
dataset = dataset.shard(hvd.size(), hvd.rank())

# 10. 定义回调函数
callbacks = [
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),  # 广播全局变量
    tf.keras.callbacks.ReduceLROnPlateau(monitor='loss', factor=0.1, patience=3) # 学习率衰减
]

# 11. 训练模型
if hvd.rank() == 0:  # 只在 rank 0 的 GPU 上保存模型
    callbacks.append(tf.keras.callbacks.ModelCheckpoint('./checkpoint/mnist_model.h5', save_best_only=True))

model.fit(dataset, epochs=10, callbacks=callbacks, verbose=1 if hvd.rank() == 0 else 0)

# 12. 评估模型
loss, accuracy = model.evaluate(x_test, y_test, verbose=0)
print(f'Loss: {loss}, Accuracy: {accuracy}')
