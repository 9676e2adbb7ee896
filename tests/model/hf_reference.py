#!/usr/bin/python3
"""Hugging Face compatibility reference for Tandem's model.

Writes a checkpoint the way Hugging Face tools do (config.json with HF's
keys, model.safetensors with HF tensor names and shapes, __metadata__
{"format": "pt"}, header padded to 8 bytes) and computes reference logits
with a small pure-PyTorch Llama/Qwen2 forward that follows
transformers' modeling_llama.py / modeling_qwen2.py (rotate_half RoPE with
ROPE_INIT_FUNCTIONS, repeat_kv, eager attention, RMSNorm, SwiGLU; Qwen3's
q_norm/k_norm over each head before RoPE; Mistral's and Qwen's sliding
windows), in float64. transformers itself is not needed.

usage: hf_reference.py make OUT [VARIANT...]
       hf_reference.py logits DIR...
  VARIANT: llama_f32 | qwen2_bf16 | llama_yarn_f16 | llama_dynamic_f32 |
           llama3_bf16 | mistral_bf16 | qwen3_tied_bf16 | qwen3_untied_f32
           (default: all)
For dynamic NTK the base comes from the longest sequence of the batch, as
in HF for a padded batch (position_ids.max() + 1).
Writes OUT/VARIANT/config.json, model.safetensors and reference.json
({"sequences": [[ids...], ...], "logits": [[[V floats] per position] per sequence]}).

`logits` reads a model directory as HF's from_pretrained would (config.json,
model.safetensors or model.safetensors.index.json + its shards; F32, BF16,
F16, F64), runs the same forward on DIR/sequences.json ([[ids...], ...]) and
writes DIR/logits.json ({"logits": ...}).
"""
import json
import math
import os
import struct
import sys

# A missing module: exit 3 and one line naming the Debian package to
# install (model_hf_compat_test fails with that line).
EXIT_MISSING_DEPENDENCY = 3
for _module, _package in (("torch", "python3-torch"), ("numpy", "python3-numpy")):
    try:
        __import__(_module)
    except ImportError:
        print(f"{sys.executable} cannot import {_module}: install {_package}: "
              "deploy/install-deps.sh --for-tests", file=sys.stderr)
        sys.exit(EXIT_MISSING_DEPENDENCY)
import torch  # noqa: E402


def variant_config(name):
    base = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": 53, "hidden_size": 48, "intermediate_size": 80,
        "num_hidden_layers": 2, "num_attention_heads": 6,
        "num_key_value_heads": 2, "head_dim": 8, "hidden_act": "silu",
        "max_position_embeddings": 64, "initializer_range": 0.02,
        "rms_norm_eps": 1e-6, "use_cache": True, "pretraining_tp": 1,
        "rope_theta": 10000.0, "rope_scaling": None, "attention_bias": False,
        "attention_dropout": 0.0, "mlp_bias": False, "bos_token_id": 1,
        "eos_token_id": 2, "tie_word_embeddings": False,
        "torch_dtype": "float32", "transformers_version": "4.46.0",
    }
    if name == "llama_f32":
        return base, torch.float32
    if name == "qwen2_bf16":
        base.update({
            "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
            "tie_word_embeddings": True, "rope_theta": 1000000.0,
            "rope_scaling": {"type": "linear", "factor": 2.0},
            "use_sliding_window": True, "sliding_window": 4,
            "max_window_layers": 1, "torch_dtype": "bfloat16",
            "num_key_value_heads": 3,
        })
        del base["head_dim"], base["attention_bias"], base["mlp_bias"]
        return base, torch.bfloat16
    if name == "llama_dynamic_f32":
        base.update({
            "rope_scaling": {"rope_type": "dynamic", "factor": 2.0},
            "max_position_embeddings": 8, "num_key_value_heads": 3,
        })
        return base, torch.float32
    if name == "llama_yarn_f16":
        base.update({
            "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                             "beta_fast": 32.0, "beta_slow": 1.0},
            "max_position_embeddings": 32, "torch_dtype": "float16",
            "num_key_value_heads": 1, "eos_token_id": [2, 3],
        })
        return base, torch.float16
    if name == "llama3_bf16":
        # Llama 3.2 style: llama3 rope scaling, tied head, head_dim set and
        # not hidden/heads, an eos list. With D 16, theta 1e4 and original
        # 64, high/low 8/1: wavelengths 6.3 (kept), 19.9 and 62.8
        # (interpolated), the rest divided by factor; the test sequence
        # (160 tokens) runs 2.5x past the original context.
        base.update({
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "max_position_embeddings": 512, "tie_word_embeddings": True,
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                             "low_freq_factor": 1.0, "high_freq_factor": 8.0,
                             "original_max_position_embeddings": 64},
            "rms_norm_eps": 1e-5, "eos_token_id": [2, 3],
            "torch_dtype": "bfloat16",
        })
        return base, torch.bfloat16
    if name == "mistral_bf16":
        # Mistral-7B-v0.1 style: no head_dim, no attention_bias key, a
        # sliding window on every layer (4 here, so it matters).
        base.update({
            "architectures": ["MistralForCausalLM"], "model_type": "mistral",
            "num_key_value_heads": 2, "sliding_window": 4,
            "rope_theta": 1000000.0, "rms_norm_eps": 1e-5,
            "max_position_embeddings": 128, "torch_dtype": "bfloat16",
        })
        for k in ("head_dim", "attention_bias", "mlp_bias", "pretraining_tp"):
            del base[k]
        return base, torch.bfloat16
    if name in ("qwen3_tied_bf16", "qwen3_untied_f32"):
        # Qwen3-0.6B style: head_dim 16 against hidden 48 / 4 heads = 12,
        # q_norm/k_norm, no biases, rope_theta 1e6. The untied one also
        # slides on layers >= max_window_layers (Qwen's rule).
        tied = name == "qwen3_tied_bf16"
        base.update({
            "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "rope_theta": 1000000.0, "tie_word_embeddings": tied,
            "use_sliding_window": not tied, "sliding_window": None if tied else 4,
            "max_window_layers": 28 if tied else 1, "bos_token_id": 1,
            "eos_token_id": 2, "torch_dtype": "bfloat16" if tied else "float32",
        })
        del base["mlp_bias"], base["pretraining_tp"]
        return base, torch.bfloat16 if tied else torch.float32
    raise SystemExit("unknown variant " + name)


def variant_sequences(name):
    if name == "llama3_bf16":
        long = [1] + [(7 * i * i + 3 * i) % 53 for i in range(1, 160)]
        return [long, [1, 52, 0, 8, 8]]
    return [[1, 7, 30, 4, 9, 9, 50, 12, 3, 44, 20, 5, 17], [1, 52, 0, 8, 8]]


def has_qkv_bias(cfg):
    """Qwen2 always has q/k/v biases, Mistral never, the others when
    attention_bias."""
    if cfg["model_type"] == "qwen2":
        return True
    return cfg["model_type"] != "mistral" and cfg.get("attention_bias", False)


def make_weights(cfg, gen):
    h, v, i = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim", h // nh)
    bias = has_qkv_bias(cfg)

    def n(*shape, std=0.2):
        return torch.randn(*shape, generator=gen, dtype=torch.float64) * std

    w = {"model.embed_tokens.weight": n(v, h, std=0.5)}
    for l in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % l
        w[p + "input_layernorm.weight"] = 1 + n(h, std=0.1)
        w[p + "post_attention_layernorm.weight"] = 1 + n(h, std=0.1)
        w[p + "self_attn.q_proj.weight"] = n(nh * d, h)
        w[p + "self_attn.k_proj.weight"] = n(nkv * d, h)
        w[p + "self_attn.v_proj.weight"] = n(nkv * d, h)
        w[p + "self_attn.o_proj.weight"] = n(h, nh * d)
        if bias:
            w[p + "self_attn.q_proj.bias"] = n(nh * d, std=0.1)
            w[p + "self_attn.k_proj.bias"] = n(nkv * d, std=0.1)
            w[p + "self_attn.v_proj.bias"] = n(nkv * d, std=0.1)
        if cfg["model_type"] == "qwen3":
            w[p + "self_attn.q_norm.weight"] = 1 + n(d, std=0.3)
            w[p + "self_attn.k_norm.weight"] = 1 + n(d, std=0.3)
        w[p + "mlp.gate_proj.weight"] = n(i, h)
        w[p + "mlp.up_proj.weight"] = n(i, h)
        w[p + "mlp.down_proj.weight"] = n(h, i)
    w["model.norm.weight"] = 1 + n(h, std=0.1)
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = n(v, h)
    return w


def write_safetensors(path, tensors, dtype):
    codes = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        t = tensors[name].to(dtype).contiguous()
        if dtype == torch.bfloat16:
            raw = t.view(torch.int16).numpy().tobytes()
        else:
            raw = t.numpy().tobytes()
        header[name] = {"dtype": codes[dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for b in blobs:
            f.write(b)


def rope_inv_freq(cfg, seq_len):
    """transformers ROPE_INIT_FUNCTIONS: default, linear, dynamic, yarn."""
    base = cfg["rope_theta"]
    d = cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    rs = cfg.get("rope_scaling") or {}
    kind = rs.get("rope_type", rs.get("type", "default"))
    ar = torch.arange(0, d, 2, dtype=torch.int64).float()
    if kind == "default":
        return 1.0 / (base ** (ar / d)), 1.0
    if kind == "linear":
        return 1.0 / (base ** (ar / d)) / rs["factor"], 1.0
    if kind == "dynamic":
        mp = cfg["max_position_embeddings"]
        seq_len = max(seq_len, mp)
        base = base * ((rs["factor"] * seq_len / mp) - (rs["factor"] - 1)) ** (d / (d - 2))
        return 1.0 / (base ** (ar / d)), 1.0
    if kind == "yarn":
        factor = rs["factor"]
        mp = rs.get("original_max_position_embeddings") or cfg["max_position_embeddings"]
        att = rs.get("attention_factor")
        if att is None:
            att = 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0
        bf, bs = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1

        def corr_dim(rot):
            return (d * math.log(mp / (rot * 2 * math.pi))) / (2 * math.log(base))
        low = max(math.floor(corr_dim(bf)), 0)
        high = min(math.ceil(corr_dim(bs)), d - 1)
        if low == high:
            high += 0.001
        pos_freqs = base ** (ar / d)
        extra, inter = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
        ramp = torch.clamp((torch.arange(d // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
        extra_factor = 1 - ramp
        return inter * (1 - extra_factor) + extra * extra_factor, att
    if kind == "llama3":
        # transformers _compute_llama3_parameters, fp32 like HF.
        inv = 1.0 / (base ** (ar / d))
        factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / high) * ~(wavelen > old / low)
        return torch.where(medium, smoothed, scaled), 1.0
    raise SystemExit("rope type " + kind)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def layer_window(cfg, l):
    """HF: Qwen2/Qwen3 slide on layers >= max_window_layers when
    use_sliding_window; Mistral on every layer unless sliding_window is None
    (MistralConfig's default is 4096)."""
    if cfg["model_type"] in ("qwen2", "qwen3"):
        if cfg.get("use_sliding_window", False) and l >= cfg.get("max_window_layers", 28):
            return cfg.get("sliding_window", 4096)
    if cfg["model_type"] == "mistral":
        return cfg.get("sliding_window", 4096)
    return None


def forward(cfg, w, ids, rope_seq_len):
    h, nh, nkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim", h // nh)
    eps = cfg["rms_norm_eps"]
    bias = has_qkv_bias(cfg)
    t = len(ids)
    x = w["model.embed_tokens.weight"][torch.tensor(ids)]
    inv_freq, scale = rope_inv_freq(cfg, rope_seq_len)
    freqs = torch.arange(t, dtype=torch.float32)[:, None] * inv_freq[None, :].float()
    emb = torch.cat((freqs, freqs), dim=-1).double()
    cos, sin = emb.cos() * scale, emb.sin() * scale
    for l in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % l
        y = rms_norm(x, w[p + "input_layernorm.weight"], eps)

        def proj(name, n_heads):
            out = y @ w[p + "self_attn.%s_proj.weight" % name].T
            if bias:
                out = out + w[p + "self_attn.%s_proj.bias" % name]
            return out.view(t, n_heads, d).transpose(0, 1)  # [heads, T, D]
        q, k, v = proj("q", nh), proj("k", nkv), proj("v", nkv)
        if cfg["model_type"] == "qwen3":  # Qwen3RMSNorm over head_dim
            q = rms_norm(q, w[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, w[p + "self_attn.k_norm.weight"], eps)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(nh // nkv, dim=0)
        v = v.repeat_interleave(nh // nkv, dim=0)
        s = (q @ k.transpose(1, 2)) / math.sqrt(d)
        i_idx = torch.arange(t)[:, None]
        j_idx = torch.arange(t)[None, :]
        allowed = j_idx <= i_idx
        win = layer_window(cfg, l)
        if win is not None:
            allowed = allowed & (j_idx > i_idx - win)
        s = s.masked_fill(~allowed, float("-inf"))
        a = torch.softmax(s, dim=-1) @ v  # [H, T, D]
        a = a.transpose(0, 1).reshape(t, nh * d)
        x = x + a @ w[p + "self_attn.o_proj.weight"].T
        y = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        g = y @ w[p + "mlp.gate_proj.weight"].T
        u = y @ w[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(g) * u) @ w[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else w["lm_head.weight"]
    return x @ head.T


def read_safetensors(path):
    import numpy as np
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        raw = data[e["data_offsets"][0]:e["data_offsets"][1]]
        if e["dtype"] == "BF16":
            t = torch.from_numpy(np.frombuffer(raw, dtype=np.int16).copy()).view(torch.bfloat16)
        else:
            np_type = {"F32": np.float32, "F16": np.float16, "F64": np.float64}[e["dtype"]]
            t = torch.from_numpy(np.frombuffer(raw, dtype=np_type).copy())
        out[name] = t.double().reshape(e["shape"])
    return out


def read_model_dir(d):
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    single = os.path.join(d, "model.safetensors")
    if os.path.exists(single):
        files = ["model.safetensors"]
    else:
        with open(os.path.join(d, "model.safetensors.index.json")) as f:
            index = json.load(f)
        files = sorted(set(index["weight_map"].values()))
    w = {}
    for name in files:
        for k, t in read_safetensors(os.path.join(d, name)).items():
            if k in w:
                raise SystemExit("%s: tensor %s twice" % (d, k))
            w[k] = t
    if cfg["tie_word_embeddings"] == ("lm_head.weight" in w):
        raise SystemExit("%s: tie_word_embeddings=%s but lm_head.weight %s" % (
            d, cfg["tie_word_embeddings"], "present" if "lm_head.weight" in w else "absent"))
    return cfg, w


def logits_for_dir(d):
    cfg, w = read_model_dir(d)
    with open(os.path.join(d, "sequences.json")) as f:
        seqs = json.load(f)
    longest = max(len(s) for s in seqs)
    logits = [forward(cfg, w, s, longest).tolist() for s in seqs]
    with open(os.path.join(d, "logits.json"), "w") as f:
        json.dump({"logits": logits}, f)


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "logits":
        for d in sys.argv[2:]:
            logits_for_dir(d)
        return 0
    if len(sys.argv) < 3 or sys.argv[1] != "make":
        print(__doc__)
        return 2
    variants = sys.argv[3:] or ["llama_f32", "qwen2_bf16", "llama_yarn_f16",
                                 "llama_dynamic_f32", "llama3_bf16", "mistral_bf16",
                                 "qwen3_tied_bf16", "qwen3_untied_f32"]
    for variant in variants:
        make(os.path.join(sys.argv[2], variant), variant)
    return 0


def make(out, variant):
    os.makedirs(out, exist_ok=True)
    cfg, dtype = variant_config(variant)
    gen = torch.Generator().manual_seed(1234)
    w = make_weights(cfg, gen)
    write_safetensors(os.path.join(out, "model.safetensors"), w, dtype)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    # The logits are computed from the weights as stored (rounded to dtype).
    wq = {k: t.to(dtype).double() for k, t in w.items()}
    seqs = variant_sequences(variant)
    longest = max(len(s) for s in seqs)
    logits = [forward(cfg, wq, s, longest).tolist() for s in seqs]
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump({"sequences": seqs, "logits": logits}, f)


if __name__ == "__main__":
    sys.exit(main())
