"""``torch._inductor.config``'s settings that scripts set, with PyTorch's defaults. Setting
them (or any other name) works and changes nothing: tensorgrad.compile has no autotuner, no
Triton and no FX graph cache to tune (docs/compile.md, "Options").

Imports: nothing.
"""

coordinate_descent_tuning = False  # llm.c sets it True (an autotuner's search: none here)
max_autotune = False
freezing = False
fx_graph_cache = True
force_disable_caches = False


class triton:  # noqa: N801  (torch's name: config.triton.unique_kernel_names = True)
    unique_kernel_names = False
    cudagraphs = False
