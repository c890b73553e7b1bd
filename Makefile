# Quick start: `make demo` (train -> export -> run on an embedded default) and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
DEMO := runs/demo
# Every demo output lies under runs/ (ignored by git, ruff, mypy and pytest): nothing it writes may change
# what `make test` sees (tests/test_clean_clone.py checks this recipe).
DEMO_BUNDLE := runs/demo-bundle

.PHONY: venv venv-ros2 test test-device test-trt85 device-suite test-aarch64 aarch64-suite lint typecheck docs unit demo bench clean

# The pinned CPU torch goes in first: an unpinned torch would pull a multi-GB CUDA build.
$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: venv
	$(BIN)/mypy sac_edge bench scripts

docs: venv
	$(BIN)/python scripts/cli_reference.py

unit: venv
	$(BIN)/python -m pytest -q

test: lint typecheck venv-ros2 unit test-device test-aarch64

# Real ROS 2 for tests/ros2 (the node, a simulated robot and a lifecycle driver in their own processes): the
# PyPI wheels of ROS 2 Kilted (x86_64, CPython 3.10+) in a venv of their own, never in .venv or .venv-device
# (their .pth re-executes every interpreter of the venv), with sac-edge itself torch-free. Where the wheels
# cannot exist (another machine or an older Python) it says why in one line and the ROS tests skip with that
# reason (tests/ros2/harness.py); where they can, a failed install fails the target (and `make test`) with
# the tail of pip's log (.venv-ros2.log). Each step is announced as it starts (a cold download takes minutes).
# Every file pip downloads is checked against its sha256 (--require-hashes) from requirements/ros2-cpXY.txt, the
# pins and all they pull in for this CPython (scripts/pin_hashes.py writes it: docs/TESTING.md); a Python without
# one installs the same pins by version alone and says so. The pinned build tools (setuptools, wheel) go in
# first: empy is an sdist, built in this venv (--no-build-isolation: nothing fetched outside the hash file).
ROS2 := .venv-ros2
ROS2_STAMP := $(ROS2)/.installed-stamp
ROS2_LOG := .venv-ros2.log
ROS2_PINS := "ros-rclpy[fastrtps]==9.1.2" ros-std-msgs==5.5.1 ros-sensor-msgs==5.5.1 ros-diagnostic-msgs==5.5.1 \
	ros-lifecycle-msgs==2.3.0 ros-trajectory-msgs==5.5.1 mcap==1.6.0 mcap-ros2-support==0.6.0
ROS2_HASHED = requirements/ros2-$(shell $(PY) -c 'import sys; print("cp%d%d" % sys.version_info[:2])').txt

# One pip step of the ROS venv, announced, with the packages collected and pip's last line every 15 s:
# $(1) what it installs, $(2) pip's arguments. Its output goes to the log; a failure shows the log's tail and
# one line, removes the half-built venv and fails.
define ros2_pip
	@echo "venv-ros2: [$$(($$(date +%s) - $$(cat $(ROS2)/.started))) s] $(1)"
	@$(ROS2)/bin/python -m pip install --progress-bar off $(2) >> $(ROS2_LOG) 2>&1 & pip=$$!; n=0; \
	while sleep 1 && kill -0 $$pip 2>/dev/null; do n=$$((n + 1)); [ $$((n % 15)) -ne 0 ] || \
		echo "venv-ros2: [$$(($$(date +%s) - $$(cat $(ROS2)/.started))) s] $$(grep -c '^Collecting' $(ROS2_LOG)) packages" \
			"collected; pip: $$(grep -v 'is ignored' $(ROS2_LOG) | tail -n 1 | cut -c 1-60)"; done; \
	wait $$pip || { tail -n 25 $(ROS2_LOG); rm -rf $(ROS2); echo "venv-ros2: FAILED: $(1) (pip's output: $(ROS2_LOG))"; exit 1; }
endef

$(ROS2_STAMP): pyproject.toml $(wildcard requirements/ros2-*.txt)
	@echo "venv-ros2: building $(ROS2) (ROS 2 Kilted's PyPI wheels; pip's output: $(ROS2_LOG))"
	rm -rf $(ROS2) $(ROS2_LOG) && $(PY) -m venv $(ROS2) && date +%s > $(ROS2)/.started
ifneq (,$(wildcard $(ROS2_HASHED)))
	awk '/^[^ ]/ { keep = ($$1 ~ /^(setuptools|wheel)==/) } keep' $(ROS2_HASHED) > $(ROS2)/build-tools.txt
	$(call ros2_pip,the build tools: setuptools and wheel from $(ROS2_HASHED),--require-hashes --no-deps -r $(ROS2)/build-tools.txt)
	$(call ros2_pip,ROS 2 and all it pulls in: $(ROS2_HASHED) (hash-checked),--require-hashes --no-deps --no-build-isolation -r $(ROS2_HASHED))
	$(call ros2_pip,sac-edge itself (editable and torch-free),--no-deps --no-build-isolation -e .)
else
	@echo "venv-ros2: no $(ROS2_HASHED) for this Python: the pins are installed by version, their files not hash-checked"
	$(call ros2_pip,ROS 2 and sac-edge (by version),$(ROS2_PINS) -e .)
endif
	@echo "venv-ros2: [$$(($$(date +%s) - $$(cat $(ROS2)/.started))) s] ready"
	touch $(ROS2_STAMP)

venv-ros2:
	@if [ "$$(uname -m)" != x86_64 ] || ! $(PY) -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then \
		echo "venv-ros2: skipped: ROS 2's PyPI wheels need x86_64 and Python >= 3.10 (tests/ros2 skip)"; \
	else $(MAKE) --no-print-directory $(ROS2_STAMP); fi

# The JetPack 5 generation (Xavier NX): Python 3.8 and `pip install .` as a user would (no torch; checked),
# onnxruntime 1.16.3 (the oldest JetPack 5 onnxruntime-gpu build) and pyproject's other floors, then the
# torch-free tests (tests marked `torch` skip) and a run + bench smoke on a bundle sac-export wrote in .venv.
PY38 ?= $(shell p=$$(pyenv prefix 3.8 2>/dev/null | head -1); if [ -n "$$p" ]; then echo "$$p/bin/python"; else command -v python3.8; fi)
DEVICE := .venv-device
DEVICE_STAMP := $(DEVICE)/.installed-stamp
DEVICE_PINS := numpy==1.24.4 onnxruntime==1.16.3 onnx==1.16.0 safetensors==0.4.0 gymnasium==1.1.0 \
	mcap==1.6.0 mcap-ros2-support==0.6.0 pytest==8.3.5 pytest-timeout==2.4.0
DEVICE_TESTS := common edge_runtime/budget edge_runtime/control edge_runtime/backends edge_runtime/test_edge_cli.py \
	edge_runtime/test_bench.py edge_runtime/test_doctor.py edge_runtime/replay/test_online.py test_imports.py
DEVICE_WORK := runs/device

$(DEVICE_STAMP): pyproject.toml
	rm -rf $(DEVICE) && $(PY38) -m venv $(DEVICE)
	$(DEVICE)/bin/python -m pip install -q --upgrade pip
	$(DEVICE)/bin/python -m pip install -q $(DEVICE_PINS) .
	touch $(DEVICE_STAMP)

test-device: venv
	@if [ -z "$(PY38)" ] || [ ! -x "$(PY38)" ]; then echo "test-device: skipped: no Python 3.8 (pyenv install 3.8 runs it)"; \
	else $(MAKE) --no-print-directory device-suite; fi

# The bundles a device suite runs on, exported on x86 by the main venv into $(1): the tests' prebuilt ones
# (bundles/) and a briefly trained Pendulum exported with sac-export's flags $(2) (bundle/).
define device_bundles
	rm -rf $(1)
	$(BIN)/python tests/edge_runtime/bundles.py $(1)/bundles
	$(BIN)/sac-train --env Pendulum-v1 --total-steps 260 --learning-starts 256 --batch-size 64 --eval-every 0 \
		--out $(1)/run --no-progress
	$(BIN)/sac-export $(1)/run --out $(1)/bundle $(2)
endef

device-suite: $(DEVICE_STAMP)
	$(DEVICE)/bin/python -m pip install -q --no-deps --force-reinstall .
	@if $(DEVICE)/bin/python -c "import torch" 2>/dev/null; then echo "test-device: torch got installed"; exit 1; fi
	$(call device_bundles,$(DEVICE_WORK),--int8)
	cd tests && SAC_EDGE_TEST_BUNDLES=$(CURDIR)/$(DEVICE_WORK)/bundles ../$(DEVICE)/bin/pytest -q -p no:cacheprovider \
		$(DEVICE_TESTS)
	cd $(DEVICE_WORK) && ../../$(DEVICE)/bin/sac-edge run bundle --duration 2 --rate-hz 100 --json | tail -1
	cd $(DEVICE_WORK) && ../../$(DEVICE)/bin/sac-edge bench bundle --batch 1,8 --calls 100 --json | tail -1
	cd $(DEVICE_WORK) && ../../$(DEVICE)/bin/sac-edge doctor bundle

# The device runtime on aarch64 under qemu-user (scripts/aarch64.py): an arm64 Debian root file system
# (cached in .cache/aarch64/), the device pins under cortex-a57 (Xavier: no dot product) and the newest
# wheels under neoverse-n1 (Orin), each the torch-free device suite and run/bench/doctor; every graph's
# actions against x86_64's by the parity gate's rule. Where it cannot run (not root on Debian, no qemu),
# `prepare` says why in one line and it succeeds.
# As root on Debian this changes the host: apt-get installs qemu-user-static, binfmt-support and mmdebstrap,
# and binfmt_misc's qemu-aarch64 handler is enabled, each announced before it runs (docs/TESTING.md).
# HOST_SETUP=0 changes nothing. `prepare` has a line of its own, without $(MAKE): `make -n` (a preview, or a
# test reading the recipe) then prints it instead of running it; the suite's sub-make only runs after it
# left its mark.
AARCH64_WORK := runs/aarch64
AARCH64_READY := $(AARCH64_WORK)/.prepared
HOST_SETUP ?= 1
test-aarch64: venv
	@rm -f $(AARCH64_READY); $(BIN)/python scripts/aarch64.py prepare $(if $(filter 0,$(HOST_SETUP)),--no-host-setup); \
	rc=$$?; if [ $$rc -eq 0 ]; then mkdir -p $(AARCH64_WORK) && touch $(AARCH64_READY); elif [ $$rc -ne 3 ]; then exit $$rc; fi
	@if [ -f $(AARCH64_READY) ]; then $(MAKE) --no-print-directory aarch64-suite; fi

aarch64-suite: venv
	$(call device_bundles,$(AARCH64_WORK),--int8 --fp16)
	$(BIN)/python scripts/aarch64.py run --work $(AARCH64_WORK) --pins "$(DEVICE_PINS)" --tests "$(DEVICE_TESTS)"

# Train Pendulum-v1 briefly, export with the INT8 gate, run 10 s on the device path with budgets, bench,
# then fine-tune on a shifted Pendulum (stronger gravity) while the loop keeps running. A rerun starts over:
# the re-export discards the last run's fine-tuned weights.
demo: venv
	$(BIN)/sac-train --env Pendulum-v1 --total-steps 12000 --learning-starts 2000 --eval-every 4000 --out $(DEMO) --force
	$(BIN)/sac-export $(DEMO) --out $(DEMO_BUNDLE) --int8 --force --discard-finetuned
	$(BIN)/sac-edge run $(DEMO_BUNDLE) --rate-hz 200 --duration 10 --mem-budget-mb 400 --power-budget-w 15 --telemetry runs/demo-telemetry.jsonl --overwrite-telemetry
	$(BIN)/sac-edge bench $(DEMO_BUNDLE) --batch 1,8,64 --out runs/demo-bench.json --plot runs/demo-bench.png --overwrite
	$(BIN)/sac-edge run $(DEMO_BUNDLE) --finetune --shift g=13 --rate-hz 100 --duration 45 --telemetry runs/demo-finetune.jsonl --overwrite-telemetry

bench: venv
	$(BIN)/python bench/train_speed.py
	$(BIN)/python bench/default_speed.py
	$(BIN)/python bench/export_quality.py
	$(BIN)/python bench/edge_loop.py

clean:
	rm -rf runs bundles sweeps $(DEVICE) $(ROS2) .pytest_cache .mypy_cache .ruff_cache

# The real TensorRT 8.5.3.1 wheel (JetPack 5.1's generation; 525 MB, kept in .cache/) on the Python 3.8 install:
# doctor prints its whole report with TensorRT saying no CUDA device is usable, run --backend tensorrt exits 2
# in one line. Not in `make test`: the download alone is larger than everything else it fetches.
# The run's line is shown on make's own stderr (>&2): reopening /dev/stderr (tee) would truncate a log it goes to.
TRT85_BUNDLE := runs/trt85
test-trt85: venv $(DEVICE_STAMP)
	$(DEVICE)/bin/python -m pip install -q --no-deps --force-reinstall .
	rm -rf $(TRT85_BUNDLE) && cd tests && ../$(BIN)/python edge_runtime/bundles.py ../$(TRT85_BUNDLE)
	$(DEVICE)/bin/python scripts/real_tensorrt.py 8.5.3.1 -- $(DEVICE)/bin/sac-edge doctor $(TRT85_BUNDLE)/pendulum \
		| tee $(TRT85_BUNDLE)/doctor.txt | grep -E "^bundle +tensorrt \(any precision\) +no +no CUDA device usable"
	grep -qE "^bundle +onnxruntime fp32 +ok" $(TRT85_BUNDLE)/doctor.txt
	$(DEVICE)/bin/python scripts/real_tensorrt.py 8.5.3.1 -- $(DEVICE)/bin/sac-edge run $(TRT85_BUNDLE)/pendulum \
		--backend tensorrt --duration 1 2>$(TRT85_BUNDLE)/run.err; test $$? -eq 2
	grep -v -i cryptography $(TRT85_BUNDLE)/run.err >&2; \
		test "$$(grep -v -i cryptography $(TRT85_BUNDLE)/run.err | grep -c .)" -eq 1
