"""TorchEstimator and TorchModel (see chorus.spark.torch)."""
import glob
import io
import os
import uuid

import numpy as np


def _arrays(df, cols):
    """Spark ML vector columns as arrays of doubles (what Parquet and pandas carry)."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.ml.linalg import VectorUDT
    for c in cols:
        if isinstance(df.schema[c].dataType, VectorUDT):
            df = df.withColumn(c, vector_to_array(df[c]))
    return df


def _tensor(values, shape):
    import torch
    arr = np.stack([np.asarray(v, dtype=np.float32) for v in values]) if len(values) and \
        isinstance(values[0], (list, np.ndarray)) else np.asarray(values, dtype=np.float32)
    t = torch.from_numpy(arr)
    return t.reshape(shape) if shape is not None else t


def _read_share(path, rank, size, cols):
    """This rank's rows of the Parquet folder: whole files when there are enough, else every size-th row."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    files = sorted(glob.glob(os.path.join(path, "*.parquet")))
    tables = [pq.read_table(f, columns=cols) for f in (files[rank::size] if len(files) >= size else files)]
    rows = pa.concat_tables(tables).to_pydict() if tables else {c: [] for c in cols}
    if len(files) < size:
        rows = {c: v[rank::size] for c, v in rows.items()}
    return rows


def _train(payload):
    """One rank's training (runs under chorus.spark.run)."""
    import torch
    import chorus.torch as hvd
    hvd.init()
    p = payload
    model = p["model"]
    optimizer = p["optimizer_class"](model.parameters(), **p["optimizer_defaults"])
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         backward_passes_per_step=p["backward_passes_per_step"])
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    cols = p["feature_cols"] + p["label_cols"]

    def load(path):
        rows = _read_share(path, hvd.rank(), hvd.size(), cols)
        feats = [_tensor(rows[c], s) for c, s in zip(p["feature_cols"], p["input_shapes"])]
        labels = [_tensor(rows[c], None) for c in p["label_cols"]]
        return feats, labels

    train_x, train_y = load(p["train_path"])
    val = load(p["val_path"]) if p["val_path"] else None
    g = torch.Generator().manual_seed(1000 + hvd.rank())
    history = {"train_loss": [], "val_loss": []}
    # Every rank takes the same number of steps (the fewest rows any rank holds).
    n_local = len(train_y[0])
    steps = hvd.allreduce(torch.tensor(n_local // p["batch_size"]), op=hvd.Min, name="steps").item()
    if steps == 0:
        raise ValueError(f"TorchEstimator: a rank holds {n_local} training rows, fewer than batch_size="
                         f"{p['batch_size']}")
    for epoch in range(p["epochs"]):
        model.train()
        order = torch.randperm(n_local, generator=g)
        total = 0.0
        for s in range(steps):
            idx = order[s * p["batch_size"]:(s + 1) * p["batch_size"]]
            optimizer.zero_grad()
            out = model(*[x[idx] for x in train_x])
            loss = p["loss"](out, train_y[0][idx])
            loss.backward()
            optimizer.step()
            total += loss.item()
        history["train_loss"].append(hvd.allreduce(torch.tensor(total / steps), name="train_loss").item())
        if val is not None:
            model.eval()
            with torch.no_grad():
                vloss = p["loss"](model(*val[0]), val[1][0]).item() if len(val[1][0]) else 0.0
            history["val_loss"].append(hvd.allreduce(torch.tensor(vloss), name="val_loss").item())
        if hvd.rank() == 0 and p["verbose"]:
            print(f"epoch {epoch}: train loss {history['train_loss'][-1]:.4f}"
                  + (f", val loss {history['val_loss'][-1]:.4f}" if val is not None else ""))
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    return {"state": buf.getvalue(), "history": history} if hvd.rank() == 0 else None


class TorchEstimator:
    """Horovod's TorchEstimator arguments: backend or num_proc, store, model, optimizer,
    loss, input_shapes, feature_cols, label_cols, batch_size, epochs, validation
    (a fraction, or a column marking validation rows), backward_passes_per_step, verbose."""

    def __init__(self, num_proc=None, model=None, backend=None, store=None, optimizer=None, loss=None,
                 feature_cols=None, label_cols=None, input_shapes=None, validation=None, batch_size=32, epochs=1,
                 verbose=1, backward_passes_per_step=1, run_id=None, output_cols=None, **unused):
        if model is None or optimizer is None or loss is None or not feature_cols or not label_cols:
            raise ValueError("TorchEstimator needs model, optimizer, loss, feature_cols and label_cols")
        if store is None:
            raise ValueError("TorchEstimator needs store (chorus.spark.common.store.Store.create(path))")
        if input_shapes is not None and len(input_shapes) != len(feature_cols):
            raise ValueError(f"TorchEstimator: {len(input_shapes)} input_shapes for {len(feature_cols)} feature_cols")
        if unused:
            import warnings
            warnings.warn(f"TorchEstimator: arguments chorus does not use: {sorted(unused)}")
        from chorus.spark.common.backend import SparkBackend
        self.backend = backend or SparkBackend(num_proc=num_proc)
        self.store, self.model, self.optimizer, self.loss = store, model, optimizer, loss
        self.feature_cols, self.label_cols = list(feature_cols), list(label_cols)
        self.input_shapes = input_shapes or [None] * len(feature_cols)
        self.validation, self.batch_size, self.epochs = validation, batch_size, epochs
        self.verbose, self.backward_passes_per_step = verbose, backward_passes_per_step
        self.run_id = run_id
        self.output_cols = output_cols

    def getModel(self):  # noqa: N802 - Spark ML's names
        return self.model

    def _split(self, df):
        if isinstance(self.validation, str):
            return df.filter(~df[self.validation]), df.filter(df[self.validation])
        if self.validation:
            train, val = df.randomSplit([1.0 - float(self.validation), float(self.validation)], seed=42)
            return train, val
        return df, None

    def fit(self, df, params=None):
        import torch
        cols = self.feature_cols + self.label_cols
        missing = [c for c in cols if c not in df.columns]
        if missing:
            raise ValueError(f"TorchEstimator.fit: the DataFrame has no column(s) {missing}; it has {df.columns}")
        run_id = self.run_id or "run_" + uuid.uuid4().hex[:8]
        n = self.backend.num_processes()
        train, val = self._split(_arrays(df, cols))
        idx = uuid.uuid4().hex[:8]
        train_path, val_path = self.store.get_train_data_path(idx), self.store.get_val_data_path(idx)
        train.select(*cols).repartition(n).write.mode("overwrite").parquet(train_path)
        if val is not None:
            val.select(*cols).repartition(n).write.mode("overwrite").parquet(val_path)
        payload = {"model": self.model, "optimizer_class": type(self.optimizer),
                   "optimizer_defaults": dict(self.optimizer.defaults), "loss": self.loss,
                   "feature_cols": self.feature_cols, "label_cols": self.label_cols,
                   "input_shapes": self.input_shapes, "train_path": train_path,
                   "val_path": val_path if val is not None else None, "batch_size": self.batch_size,
                   "epochs": self.epochs, "verbose": self.verbose,
                   "backward_passes_per_step": self.backward_passes_per_step}
        result = self.backend.run(_train, args=(payload,))[0]
        trained = self.model
        trained.load_state_dict(torch.load(io.BytesIO(result["state"])))
        self.store.write(self.store.get_checkpoint_path(run_id), result["state"])
        return TorchModel(trained, self.feature_cols, self.label_cols, self.input_shapes, result["history"], run_id,
                          self.output_cols)


class TorchModel:
    """A trained model as a Spark transformer: transform(df) adds one output column
    per label column (setOutputCols names them; default <label>__output)."""

    def __init__(self, model, feature_cols, label_cols, input_shapes, history, run_id, output_cols=None):
        self.model, self.feature_cols, self.label_cols = model, feature_cols, label_cols
        self.input_shapes, self.history, self.run_id = input_shapes, history, run_id
        self.output_cols = output_cols or [f"{c}__output" for c in label_cols]

    def setOutputCols(self, cols):  # noqa: N802 - Spark ML's names
        self.output_cols = list(cols)
        return self

    def getOutputCols(self):  # noqa: N802
        return self.output_cols

    def getHistory(self):  # noqa: N802
        return self.history

    def getModel(self):  # noqa: N802
        return self.model

    def transform(self, df):
        import pandas as pd
        import torch
        from pyspark.sql.functions import pandas_udf
        from pyspark.sql.types import ArrayType, DoubleType
        buf = io.BytesIO()
        torch.save(self.model.state_dict(), buf)
        model, state, shapes = self.model, buf.getvalue(), self.input_shapes
        df = _arrays(df, self.feature_cols)

        @pandas_udf(ArrayType(DoubleType()))
        def predict(*columns):
            import torch as t
            model.load_state_dict(t.load(io.BytesIO(state)))
            model.eval()
            with t.no_grad():
                out = model(*[_tensor(list(c), s) for c, s in zip(columns, shapes)])
            out = out.reshape(len(columns[0]), -1).double().numpy()
            return pd.Series([row.tolist() for row in out])

        return df.withColumn(self.output_cols[0], predict(*[df[c] for c in self.feature_cols]))
