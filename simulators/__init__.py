"""Simulators of the third-party services the gateway calls, speaking their real HTTP protocols.

They serve the tests, `make demo` and the benchmarks; they are not part of the gateway package or its image.

- `simulators.hunyuan`: Tencent Hunyuan's OpenAI-compatible chat API
  (`create_hunyuan_simulator`, `SimulatorConfig`, `SimulatorStats`; `python -m simulators.hunyuan`).
- `simulators.pika`: Pika's video API as fal.ai serves it, the fal queue protocol with signed webhooks
  (`create_pika_simulator`, `PikaSimulatorConfig`, `PikaSimulatorStats`; `python -m simulators.pika`).
- `simulators.serve`: what both share, the app that carries a simulator's state and the command line that serves it.

Import from the sub-packages: this package imports none of them, so that importing one loads only its own modules.
"""
