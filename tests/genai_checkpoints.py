"""Tiny random transformers checkpoints of the decoder families genai's model builder takes, saved with
save_pretrained beside a small word-level tokenizer: the family matrix of tests/test_genai.py, no downloads."""
from __future__ import annotations

import pathlib

# The builder takes any Linear with vocab_size outputs for the LM head: the vocabulary differs from every projection
# width (Phi-3's merged gate_up_proj has 2 x 128)
VOCAB = 300
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def _configs():
    import transformers as tf
    return {
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM, dict(tie_word_embeddings=False)),
        "mistral": (tf.MistralConfig, tf.MistralForCausalLM, dict(sliding_window=None, head_dim=16)),
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM, dict(use_sliding_window=False, tie_word_embeddings=True)),
        "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM, dict(head_dim=16, tie_word_embeddings=True)),
        "phi3": (tf.Phi3Config, tf.Phi3ForCausalLM, dict(original_max_position_embeddings=128,
                                                         tie_word_embeddings=False)),
        "gemma": (tf.GemmaConfig, tf.GemmaForCausalLM, dict(head_dim=16, hidden_activation="gelu_pytorch_tanh")),
        "gemma2": (tf.Gemma2Config, tf.Gemma2ForCausalLM, dict(head_dim=16, sliding_window=64,
                                                               query_pre_attn_scalar=16)),
        # one local and one global layer: both rotary thetas (genai/_builder.py adapts them for the builder)
        "gemma3": (tf.Gemma3TextConfig, tf.Gemma3ForCausalLM, dict(head_dim=16, sliding_window=64,
                                                                   query_pre_attn_scalar=16,
                                                                   layer_types=["sliding_attention",
                                                                                "full_attention"])),
    }


FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma", "gemma2", "gemma3")


def tokenizer():
    """Words t0..t299, one id each: prompts like 't5 t9 t33' tokenize to known ids."""
    import transformers as tf
    from tokenizers import Tokenizer, models, pre_tokenizers
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tf.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", bos_token="t1", eos_token="t2",
                                      pad_token="t0")


def save(family: str, folder: pathlib.Path, seed: int = 0) -> pathlib.Path:
    """The tiny `family` checkpoint with random weights (seeded) in `folder`."""
    import torch
    config_cls, model_cls, extra = _configs()[family]
    config = config_cls(**{**COMMON, **extra})
    config.architectures = [model_cls.__name__]
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    with torch.no_grad():  # weights larger than the init's, so that the logits are not near-uniform
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4.0)
    model.save_pretrained(str(folder), safe_serialization=True)
    tokenizer().save_pretrained(str(folder))
    return folder
