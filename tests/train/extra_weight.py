"""A GPT with one 2-D weight outside today's names, for the test that mds_model's parameter table
alone says where a new weight goes: `mlp.extra.weight`, a second column-parallel projection whose
output is added to dense_h_to_4h's, registered after the MLP's own parameters and decayed.
`install()` adds its row to the table and the weight to the module; `python extra_weight.py
mds-train|mds-merge-mp ARGS` runs that tool with it installed (a subprocess: the patch must not
reach other tests)."""

from __future__ import annotations

import sys


def install() -> None:
    from mds_model import kernels, parameters, transformer
    from mds_model.layers import ColumnParallelLinear

    row = parameters._Row(
        "mlp.extra.weight", lambda c: (c.ffn_size, c.hidden_size), parameters.ROWS, True
    )
    parameters._LAYER = (*parameters._LAYER, row)
    mlp = transformer.ParallelMLP
    init = mlp.__init__

    def __init__(self, config, *, groups) -> None:
        init(self, config, groups=groups)
        self.extra = ColumnParallelLinear(
            config.hidden_size,
            config.ffn_size,
            groups=groups,
            init_std=config.init_method_std,
            bias=False,
            dtype=config.torch_dtype,
        )

    def patched_forward(self, x):  # ParallelMLP.forward with the extra projection added
        y = self.dense_h_to_4h(x) + self.extra(x)
        y = kernels.bias_gelu(
            y, self.dense_h_to_4h.bias, approximate=self.gelu_approximate, use_kernel=False
        )
        return self.dense_4h_to_h(y)

    mlp.__init__, mlp.forward = __init__, patched_forward


if __name__ == "__main__":
    install()
    tool, args = sys.argv[1], sys.argv[2:]
    if tool == "mds-train":
        from mds_train.cli import main
    else:
        from mds_checkpoint.cli import main
    main(args)
