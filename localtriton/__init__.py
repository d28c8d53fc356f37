"""Run the real tritonserver from the nvidia-pytriton wheel on a model repository, on ports no client takes."""
