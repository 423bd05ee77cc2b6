"""Benchmarks of qlinear beyond the `qlinear bench` command, kept out of the
library package (they need PyTorch and run for minutes):

    python3 -m qlinear_bench.e2e ...    one forward step of a diffusion transformer
                                        (the anima shapes) per path, PyTorch against
                                        qlinear; --overhead: the binding's per-call cost

Modules: e2e (command line, the timed steps, the report), dit (the model),
overhead (the per-call timings), env (thread pools, BLAS and malloc setup,
applied by re-executing the process), report (medians, JSON, the chart).
Run from the source tree: PYTHONPATH=python (qlinear found beside it).
"""
