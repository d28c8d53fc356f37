"""Simulators of the third-party services the gateway calls, speaking their real HTTP protocols.

- `gateway.sim.hunyuan`: Tencent Hunyuan's OpenAI-compatible chat API
  (`create_hunyuan_simulator`, `SimulatorConfig`, `SimulatorStats`; `python -m gateway.sim.hunyuan`).

Import from the submodules: this package imports none of them, so that `python -m gateway.sim.hunyuan`
runs the module once, as `__main__`.
"""
