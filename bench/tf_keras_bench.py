"""Keras model.fit throughput with chorus.tensorflow.keras beside TensorFlow's own
multi-worker path, tf.distribute.MultiWorkerMirroredStrategy (ring all-reduce over
gRPC), on the same model, data and ranks, alternating rounds; and the latency of
an 8-byte allreduce inside tf.function (a chain of dependent ops in one graph, so
the function call is not counted), beside MultiWorkerMirroredStrategy's.

    build/venv-tf/bin/python bench/tf_keras_bench.py [--ranks 2] [--rounds 3] [--steps 60] [--json out.json]

Keras 3's model.fit does not run under the strategy (keras-team/keras#20585), so the
strategy runs the same Keras model in its own step loop; chorus runs both model.fit and
that same loop.

Each run is a separate job: chorusrun for chorus; for the strategy, this script
starts the workers with TF_CONFIG on loopback ports. A worker prints one JSON line.
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
BUILD = os.environ.get("CHORUS_BUILD_DIR", os.path.join(REPO, "build"))
# chorus: Keras model.fit with chorus's DistributedOptimizer; chorus_loop: the same
# hand-written step as mwms (MultiWorkerMirroredStrategy's strategy.run) with
# chorus's DistributedGradientTape.
KINDS = ("chorus", "chorus_loop", "mwms")


def build_model(keras, width, depth):
    layers = [keras.Input((784,))]
    for _ in range(depth):
        layers.append(keras.layers.Dense(width, activation="relu"))
    layers.append(keras.layers.Dense(10))
    m = keras.Sequential(layers)
    return m


def data(np, n):
    g = np.random.default_rng(0)
    x = g.normal(size=(n, 784)).astype(np.float32)
    return x, (x[:, :10].argmax(1)).astype(np.int64)


def worker(args):
    import numpy as np
    import tensorflow as tf
    import keras

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    per = args.batch
    if args.worker in ("chorus", "chorus_loop"):
        import chorus.tensorflow.keras as hvd
        import chorus.tensorflow as hvd_tf
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        keras.utils.set_random_seed(1)
        model = build_model(keras, args.width, args.depth)
        x, y = data(np, per * size * args.steps)
        ds = tf.data.Dataset.from_tensor_slices((x, y)).shard(size, rank).batch(per).repeat()
        if args.worker == "chorus":
            model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss=loss)
            fit = lambda steps: model.fit(ds, steps_per_epoch=steps, epochs=1, verbose=0)  # noqa: E731
        else:
            # The strategy's loop below, step for step, with chorus's tape in place of its all-reduce.
            batches = iter(ds)
            per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

            @tf.function
            def train_step(it):
                xb, yb = next(it)
                with tf.GradientTape() as tape:
                    lv = tf.reduce_mean(per_example(yb, model(xb, training=True)))
                grads = hvd_tf.DistributedGradientTape(tape).gradient(lv, model.trainable_variables)
                for v, g in zip(model.trainable_variables, grads):
                    v.assign_sub(0.01 * g)
                return lv

            def fit(steps):
                for _ in range(steps):
                    train_step(batches)

        @tf.function
        def chain(t):
            for i in range(200):
                t = hvd._mpi_ops._allreduce(t, op=hvd.Max, name=f"lat.{i}")
            return t
        reduce_chain = chain
    else:
        # Keras 3's model.fit does not run under MultiWorkerMirroredStrategy (keras-team/keras#20585),
        # nor does its optimizer's update in the strategy's replica context ("destinations can not be
        # empty"): the same Keras model's step runs in TensorFlow's own loop, strategy.run, whose
        # replica context all-reduces the gradients (the strategy's collectives), then plain SGD.
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        rank, size = strategy.cluster_resolver.task_id, strategy.num_replicas_in_sync
        keras.utils.set_random_seed(1)
        model = build_model(keras, args.width, args.depth)
        x, y = data(np, per * size * args.steps)
        opts = tf.data.Options()
        opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
        ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(per * size).repeat().with_options(opts)
        batches = iter(strategy.experimental_distribute_dataset(ds))
        per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

        def replica_step(xb, yb):
            with tf.GradientTape() as tape:
                lv = tf.nn.compute_average_loss(per_example(yb, model(xb, training=True)),
                                                global_batch_size=per * size)
            grads = tape.gradient(lv, model.trainable_variables)
            grads = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, grads)
            for v, g in zip(model.trainable_variables, grads):
                v.assign_sub(0.01 * g)
            return lv

        @tf.function
        def train_step(it):
            xb, yb = next(it)
            return strategy.run(replica_step, args=(xb, yb))

        def fit(steps):
            for _ in range(steps):
                train_step(batches)

        @tf.function
        def chain(t):
            def replica():
                ctx = tf.distribute.get_replica_context()
                v = tf.identity(t)
                for _ in range(200):
                    v = ctx.all_reduce(tf.distribute.ReduceOp.SUM, v) * 0.5
                return v
            return strategy.run(replica)
        reduce_chain = chain
    fit(5)  # trace and warm up
    t0 = time.perf_counter()
    fit(args.steps)
    seconds = time.perf_counter() - t0
    v = tf.constant([1.0, 2.0])  # 8 bytes
    reduce_chain(v)
    runs = []
    for _ in range(7):  # the median of 7 chains of 200 dependent ops
        t0 = time.perf_counter()
        reduce_chain(v)
        runs.append((time.perf_counter() - t0) / 200)
    lat = statistics.median(runs)
    if rank == 0:
        print(json.dumps({"samples_per_s": per * size * args.steps / seconds, "allreduce_8b_us": lat * 1e6}),
              flush=True)


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def run(kind, args):
    common = ["--worker", kind, "--steps", str(args.steps), "--batch", str(args.batch), "--width",
              str(args.width), "--depth", str(args.depth)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", OMP_NUM_THREADS="1",
               PYTHONPATH=os.path.join(BUILD, "python"))
    if kind.startswith("chorus"):
        cmd = [os.path.join(BUILD, "chorusrun"), "-np", str(args.ranks), sys.executable, __file__, *common]
        out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             timeout=900).stdout
    else:
        hosts = [f"127.0.0.1:{p}" for p in free_ports(args.ranks)]
        procs = []
        for i in range(args.ranks):
            cfg = {"cluster": {"worker": hosts}, "task": {"type": "worker", "index": i}}
            procs.append(subprocess.Popen([sys.executable, __file__, *common], env=dict(env, TF_CONFIG=json.dumps(cfg)),
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        out = "".join(p.communicate(timeout=900)[0] for p in procs)
    for line in out.splitlines():
        line = line.split(">:", 1)[-1]
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"{kind} run printed no result:\n{out[-3000:]}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--worker", choices=KINDS)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch", type=int, default=64, help="samples per rank per step")
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--depth", type=int, default=3)
    p.add_argument("--json")
    args = p.parse_args()
    if args.worker:
        return worker(args)
    rows = []
    for r in range(args.rounds):
        for kind in (KINDS if r % 2 == 0 else tuple(reversed(KINDS))):
            res = run(kind, args)
            res.update(kind=kind, round=r)
            rows.append(res)
            print(f"round {r} {kind:11s} {res['samples_per_s']:9.1f} samples/s  8 B allreduce "
                  f"{res['allreduce_8b_us']:7.1f} us", flush=True)
    med = {k: statistics.median(x["samples_per_s"] for x in rows if x["kind"] == k) for k in KINDS}
    lat = {k: statistics.median(x["allreduce_8b_us"] for x in rows if x["kind"] == k) for k in KINDS}
    params = args.width * 784 + (args.depth - 1) * args.width * args.width + args.width * 10
    print(f"{args.ranks} ranks, MLP {args.depth}x{args.width} ({params / 1e6:.2f} M parameters), "
          f"{args.batch} samples/rank/step: chorus model.fit {med['chorus']:.1f} samples/s, chorus loop "
          f"{med['chorus_loop']:.1f}, MultiWorkerMirroredStrategy loop {med['mwms']:.1f}: ratios "
          f"{med['chorus'] / med['mwms']:.2f}x (fit) and {med['chorus_loop'] / med['mwms']:.2f}x (same loop); "
          f"8 B allreduce in tf.function: chorus {lat['chorus']:.1f} us, strategy {lat['mwms']:.1f} us")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "median_samples_per_s": med, "median_allreduce_8b_us": lat,
                       "ratio_fit": med["chorus"] / med["mwms"], "ratio_loop": med["chorus_loop"] / med["mwms"],
                       "args": vars(args)}, f, indent=1)


if __name__ == "__main__":
    main()
