#!/usr/bin/env bash
# Fetch, here, the wheels that scripts/gpu_check.sh installs on the lent GPU machine into .whl/ (ignored
# by git; name it in the device call's `carry`). That machine has no network and Python 3.12; its image
# already holds torch, numpy, onnx, onnxruntime, safetensors, tqdm, matplotlib, tensorboard and pytest,
# so only the environments, the SB3 reference and onnxslim travel, at the versions this venv uses.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .whl
mkdir .whl
platforms=()
for n in 2_28 2_27 2_17 2014 1; do
    case $n in 2014 | 1) platforms+=(--platform "manylinux${n}_x86_64") ;; *) platforms+=(--platform "manylinux_${n}_x86_64") ;; esac
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d .whl \
    gymnasium==1.4.0 farama-notifications==0.0.6 \
    mujoco==4.0.0 mujoco-core==4.0.0 mujoco-studio==4.0.0 glfw==2.11.0 pyopengl==3.1.10 websockets==17.4 \
    stable-baselines3==2.9.2 onnxslim==0.1.98
ls .whl
du -sh .whl
