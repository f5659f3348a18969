# Two entry points (see README.md): `make demo` and `make test`.
# Each installs what it needs (apt packages, .venv/), builds into build/, and runs.
PY      := .venv/bin/python
JOBS    ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE   ?= cmake
LIBFILE := build/tz-capi/libtensorizer.so.0

.PHONY: all setup upstream build python wheel deb deb-test test test-cpp test-asan test-python test-wheel test-upstream-suite abi-check abi-baseline demo bench clean fuzz-setup fuzz-build fuzz-ci fuzz

all: build

setup:
	bash scripts/setup.sh

upstream: setup
	bash scripts/setup-upstream.sh

# tz-torch builds against the libtorch inside .venv's torch wheel, when there is one.
build: setup
	tp=$$($(PY) -c "import torch; print(torch.utils.cmake_prefix_path)" 2>/dev/null); \
	  $(CMAKE) -S . -B build -DCMAKE_BUILD_TYPE=Release $${tp:+-DCMAKE_PREFIX_PATH=$$tp} >/dev/null
	$(CMAKE) --build build -j $(JOBS)
	$(MAKE) --no-print-directory python

# The Python package loads the C library from its own directory. Replaced by
# rename, never rewritten in place: a running process may have it mapped.
# Its cffi declarations are generated from the header, as a wheel build does.
python:
	cp -L $(LIBFILE) tz-python/tensorizer/libtensorizer.so.0.tmp
	mv -f tz-python/tensorizer/libtensorizer.so.0.tmp tz-python/tensorizer/libtensorizer.so.0
	$(PY) tz-python/build_backend/gen_cdef.py tz-capi/include/tensorizer.h \
	  -I build/tz-capi/include -o tz-python/tensorizer/_cdef.py
	@# The checkout's package, on .venv's path (a wheel build is `make wheel`).
	@$(PY) -m pip uninstall -q -y tensorizer tensorizer-native 2>/dev/null || true
	@rm -rf tz-python/*.egg-info
	@$(PY) -c "import site, sys; open(site.getsitepackages()[0] + '/tensorizer-checkout.pth', 'w').write(sys.argv[1] + '\n')" $(CURDIR)/tz-python

# The distributable Python package: an sdist and a self-contained wheel in
# dist/ (libtensorizer built by the wheel's own CMake build; libsodium,
# libcurl, hiredis and what they need vendored by auditwheel).
wheel: setup
	rm -rf build/wheel-raw dist
	$(PY) -m build tz-python --outdir build/wheel-raw
	PATH="$(CURDIR)/.venv/bin:$$PATH" $(PY) -m auditwheel repair --strip -w dist build/wheel-raw/*.whl
	cp build/wheel-raw/*.tar.gz dist/

# Installs the wheel into a throwaway venv with no compilers on PATH and no
# checkout on sys.path, and uses it there.
test-wheel: wheel
	TZ_REQUIRE_WHEEL=1 $(PY) -m pytest -q tests/packaging

# The exported C ABI against the committed baseline (tz-capi/abi/): removing
# or changing a function or public struct fails, adding passes.
abi-check: build
	bash tz-capi/abi/check-abi.sh build

# Rewrites the baseline: only for a deliberate, reviewed ABI change.
abi-baseline: build
	bash tz-capi/abi/check-abi.sh build --update

# Debian packages (debian/) in build/deb/, lintian-checked: see README.md,
# "Debian packages". deb-test installs them into a fresh bookworm root.
deb:
	bash scripts/deb-build.sh

deb-test: deb
	bash tests/deb/run-deb-test.sh

test-cpp: build
	cd build && ctest --output-on-failure

# The C++ tests again under AddressSanitizer and UndefinedBehaviorSanitizer.
test-asan: setup
	$(CMAKE) -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DTZ_SANITIZE=address,undefined -DTZ_WITH_TORCH=OFF >/dev/null
	$(CMAKE) --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure

test-python: build upstream
	TZ_REQUIRE_UPSTREAM=1 $(PY) -m pytest -q tz-python/tests tests --ignore=tests/packaging

# Upstream tensorizer 2.12.1's own test suite (from its sdist, fetched into
# build/upstream-suite/, never committed), run against upstream itself
# (.venv-upstream) and against ours (.venv), with an offline stand-in for the
# model it loads; prints test | upstream | ours and fails when a test that
# passes with upstream does not pass with ours (see README.md for exceptions).
test-upstream-suite: build upstream
	bash scripts/setup-upstream-suite.sh
	$(PY) scripts/run-upstream-suite.py

# Fuzz targets (fuzz/README.md), built with clang's libFuzzer, ASan and UBSan.
# Every build also replays their regression inputs through ctest (fuzz_replay_*).
FUZZ_TARGETS := file_header tensor_header crypt_info tensor_path reader reader_coalesced writer
FUZZ_SECONDS ?= 40

fuzz-setup:
	bash scripts/setup-fuzz.sh

fuzz-build: setup fuzz-setup
	$(CMAKE) -S . -B build-fuzz -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTZ_FUZZ=ON -DTZ_SANITIZE=address,undefined \
	  -DTZ_WITH_TORCH=OFF -DTZ_BUILD_TESTS=OFF >/dev/null
	$(CMAKE) --build build-fuzz --target fuzz_targets -j $(JOBS)

# CI: each target replays its regressions, then fuzzes FUZZ_SECONDS (7 x 40 s,
# under 5 minutes in all). `make fuzz FUZZ_TARGET=reader FUZZ_SECONDS=1800`
# runs one target for longer.
fuzz-ci: fuzz-build
	bash fuzz/run.sh $(FUZZ_SECONDS) $(FUZZ_TARGETS)

fuzz: fuzz-build
	bash fuzz/run.sh $(FUZZ_SECONDS) $(FUZZ_TARGET)

test: abi-check test-cpp test-asan fuzz-ci test-python test-wheel test-upstream-suite deb-test

demo: build
	$(PY) demo/demo.py

bench: build upstream
	$(PY) bench/bench_local.py

clean:
	rm -rf build build-asan build-fuzz dist tz-python/tensorizer/libtensorizer.so.0 tz-python/tensorizer/_cdef.py
