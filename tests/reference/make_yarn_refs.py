"""YaRN reference: transformers' _compute_yarn_parameters (inverse frequencies, attention factor) for the
gpt-oss and DeepSeek-V3 shapes, written to tests/fixtures/yarn/yarn.npz for tests/test_layers.py.

    python tests/reference/make_yarn_refs.py      # needs torch + transformers; the tests do not
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parents[1] / "fixtures" / "yarn" / "yarn.npz"

# (name, head_dim, base, rope_parameters): gpt-oss-20b's and DeepSeek-V3's config.json rope settings
CASES = [
    ("gptoss", 64, 150000.0, {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                              "original_max_position_embeddings": 4096, "truncate": False}),
    ("deepseek", 64, 10000.0, {"rope_type": "yarn", "factor": 40.0, "beta_fast": 32.0, "beta_slow": 1.0,
                               "original_max_position_embeddings": 4096}),
]


def main() -> None:
    import transformers
    from transformers.modeling_rope_utils import _compute_yarn_parameters

    out = {}
    for name, head_dim, base, rp in CASES:
        cfg = transformers.LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, head_dim=head_dim,
                                       max_position_embeddings=131072,
                                       rope_parameters={"rope_theta": base, **rp})
        inv_freq, attn = _compute_yarn_parameters(cfg)
        out[f"{name}_inv_freq"] = inv_freq.numpy().astype(np.float32)
        out[f"{name}_attention_factor"] = np.float32(attn)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    np.savez(OUT, **out, transformers=transformers.__version__)
    print(OUT, {k: v.shape for k, v in out.items()})


if __name__ == "__main__":
    main()
