"""Small randomly initialized Hugging Face decoders for the inference reference tests (built
here, never downloaded): GPT2LMHeadModel and LlamaForCausalLM (grouped-query attention,
untied head), weights perturbed from their init so that logits are far from uniform."""
import torch
import transformers

transformers.logging.set_verbosity_error()


def tiny_model(flavor, big=False):
    """flavor 'gpt2' or 'llama'; big: a wider GPT-2 (vocab 8192, d 256, 4 layers)"""
    if flavor == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=8192 if big else 256, n_embd=256 if big else 48,
                                      n_layer=4 if big else 2, n_head=4, n_positions=128,
                                      layer_norm_epsilon=1e-5, bos_token_id=0, eos_token_id=0,
                                      attn_pdrop=0, embd_pdrop=0, resid_pdrop=0)
        m = transformers.GPT2LMHeadModel(cfg)
    else:
        cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=48, intermediate_size=80,
                                       num_hidden_layers=2, num_attention_heads=6,
                                       num_key_value_heads=2, max_position_embeddings=128,
                                       rms_norm_eps=1e-5, rope_theta=10000.0, bos_token_id=0,
                                       eos_token_id=0, tie_word_embeddings=False)
        m = transformers.LlamaForCausalLM(cfg)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    return m.eval()
