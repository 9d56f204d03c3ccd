"""per_head_muon (DeepSpeed 0.19.8's Muon option): each attention projection whose rows are
blocked by heads (query, key, value, MLA's two up-projections) is orthogonalized head by
head. Which matrices, and how many heads, come as DeepSpeed finds them: the leaf module's
name says what a matrix claims to be, the model config's head counts and widths (or, for
the linear-attention modules DeepSpeed lists, the module's own) give candidate geometries,
and only a candidate whose heads x width is exactly the matrix's row count is taken.
Each tagged parameter keeps muon_head_dim, so a tensor-parallel shard (split on rows, the
heads' axis) takes rows / head_dim heads."""
import warnings

_QUERY = ("q_proj", "query", "wq")
_KV = ("k_proj", "key", "wk", "v_proj", "value", "wv")
_MLA_Q, _MLA_KV = ("q_b_proj",), ("kv_b_proj",)
# One matrix holding Q, K and V, or an MLA down-projection: no uniform heads on the rows.
_WHOLE = ("qkv_proj", "query_key_value", "c_attn", "in_proj_qkv", "wqkv", "q_a_proj", "kv_a_proj",
          "kv_a_proj_with_mqa")
_ATTN_COUNTS = ("num_attention_heads", "num_heads", "n_heads", "n_head", "attention_heads")
_KV_COUNTS = ("num_key_value_heads", "num_kv_heads", "multi_query_group_num", "n_head_kv", "kv_n_heads",
              "num_attention_heads", "n_heads", "attention_heads")
# Linear-attention modules whose own attributes hold the geometry (DeepSpeed's list).
_LINEAR_OWNERS = ("KimiDeltaAttention",)
_OWNER_COUNTS = {"q": ("num_heads", "num_attention_heads", "n_heads"),
                 "k": ("num_k_heads", "num_key_value_heads", "num_kv_heads", "num_heads", "num_attention_heads",
                       "n_heads"),
                 "v": ("num_v_heads", "num_k_heads", "num_key_value_heads", "num_kv_heads", "num_heads",
                       "num_attention_heads", "n_heads")}
_OWNER_WIDTHS = {"q": ("head_k_dim", "head_dim", "head_size"), "k": ("head_k_dim", "head_dim", "head_size"),
                 "v": ("head_v_dim", "head_dim", "head_size")}


def _first(obj, names, positive_int=False):
    for name in names:
        value = getattr(obj, name, None)
        if positive_int and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            continue
        if value is not None:
            return value
    return None


def _kind(leaf):
    if leaf.startswith(_WHOLE):
        return "whole"
    for kind, names in (("mla-q", _MLA_Q), ("mla-kv", _MLA_KV), ("kv", _KV), ("query", _QUERY)):
        if leaf.startswith(names):
            return kind
    return None


def _candidates(kind, text, heads, kv_heads):
    head_dim = getattr(text, "head_dim", None)
    hidden = getattr(text, "hidden_size", None)
    if head_dim is None and hidden is not None and heads and hidden % heads == 0:
        head_dim = hidden // heads
    nope, rope, v_dim = (getattr(text, k, None) for k in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))
    out = []
    if kind in ("query", "mla-q") and nope is not None and rope is not None:
        out.append((heads, nope + rope, "mla-q"))
    if kind == "mla-kv" and nope is not None and v_dim is not None:
        out.append((heads, nope + v_dim, "mla-kv"))
    if kind == "query" and head_dim is not None:
        out.append((heads, head_dim, "head-dim"))
    if kind == "kv" and head_dim is not None:
        out.append((kv_heads or heads, head_dim, "head-dim"))
    return [c for c in out if c[0] and c[0] >= 1 and c[1] and c[1] >= 1]


def _owner_candidates(kind, leaf, owner):
    if owner is None or kind not in ("query", "kv") or type(owner).__name__ not in _LINEAR_OWNERS:
        return []
    role = "q" if kind == "query" else "v" if leaf.startswith(("v_proj", "value", "wv")) else "k"
    heads = _first(owner, _OWNER_COUNTS[role], positive_int=True)
    width = _first(owner, _OWNER_WIDTHS[role], positive_int=True)
    return [(heads, width, "owner-" + role)] if heads and width else []


def _confirm(shape, candidates):
    if len(shape) != 2:
        return None, "not-2d"
    if not candidates:
        return None, "no-candidate-geometry"
    exact = [c for c in candidates if shape[0] == c[0] * c[1]]
    if not exact:
        return None, "width-mismatch"
    if len({c[0] for c in exact}) > 1:
        return None, "ambiguous:" + "/".join(f"{c[2]}={c[0]}" for c in sorted(exact, key=lambda c: c[2]))
    return exact[0][0], exact[0][2]


def tag(model, shape_of):
    """Sets muon_head_dim on each Muon matrix of model that splits into heads (None on the
    others); raises when per_head_muon would change nothing."""
    config = getattr(model, "config", None)
    text = getattr(config, "text_config", None) or config
    heads = _first(text, _ATTN_COUNTS) if text is not None else None
    kv_heads = _first(text, _KV_COUNTS) if text is not None else None
    owners = dict(model.named_modules())
    tagged, skipped = {}, {}
    for name, p in model.named_parameters():
        p.muon_head_dim = None
        if not getattr(p, "use_muon", False) or heads is None:
            continue
        parts = name.split(".")
        leaf = (parts[-2] if len(parts) >= 2 else parts[-1]).lower()
        kind = _kind(leaf)
        if kind is None or kind == "whole":
            skipped[leaf] = "not-attention" if kind is None else "not-head-blocked"
            continue
        owner = owners.get(".".join(parts[:-2])) if len(parts) >= 3 else None
        shape = tuple(shape_of(p))
        count, why = _confirm(shape, _owner_candidates(kind, leaf, owner) or _candidates(kind, text, heads,
                                                                                         kv_heads))
        if count is None:
            skipped[leaf] = why
            continue
        p.muon_head_dim = shape[0] // count
        tagged[leaf] = f"{count} heads of {p.muon_head_dim} ({why})"
    if not tagged:
        raise ValueError("DeepSpeed config: 'optimizer.params.per_head_muon' is true but no attention projection "
                         "could be tagged, so it would change nothing: the model has no config with head counts, "
                         "its attention matrices are not named as DeepSpeed recognizes them (q_proj, k_proj, "
                         "v_proj, query, key, value, wq, wk, wv, q_b_proj, kv_b_proj), or their rows are not heads x "
                         f"width. Leaves examined: {dict(sorted(skipped.items())) or 'none'}")
    odd = {k: v for k, v in skipped.items() if v not in ("not-attention", "not-head-blocked")}
    if odd:
        warnings.warn(f"chorus: per_head_muon: {dict(sorted(odd.items()))} named as attention but no geometry "
                      "matched their rows; they are orthogonalized whole")
    return tagged


def heads_of(p, rows):
    """Heads of a tagged matrix holding `rows` rows (a tensor-parallel shard: its own), or None."""
    width = getattr(p, "muon_head_dim", None)
    return rows // width if width and rows % width == 0 else None
