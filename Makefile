# kvaudit: the two commands a fresh Debian machine needs are `make demo` and `make test`.
JOBS ?= $(shell nproc)
BUILD ?= build
ASAN_BUILD ?= build-asan
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 20
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=Release

.PHONY: all deps deps-full build asan fuzz test test-release test-asan test-fuzz demo demo-live bench format format-check clean

all: build

deps:
	@tools/install-deps.sh

deps-full:
	@tools/install-deps.sh --full

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

asan: deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVAUDIT_SANITIZE=ON -DKVAUDIT_WERROR=OFF -DKVAUDIT_BENCH=OFF \
	  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG"
	cmake --build $(ASAN_BUILD) -j $(JOBS)

fuzz: deps
	CXX=clang++-14 cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVAUDIT_FUZZ=ON -DKVAUDIT_BENCH=OFF -DKVAUDIT_WERROR=OFF
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzz_targets

test-release: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test-asan: asan
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j $(JOBS) -LE slow

test-fuzz: fuzz
	tools/run-fuzz.sh $(FUZZ_BUILD) $(FUZZ_SECONDS)

test: deps-full
	$(MAKE) test-release
	$(MAKE) test-asan
	$(MAKE) test-fuzz

demo: build
	tools/demo.sh $(BUILD)/kvaudit

demo-live: build
	tools/demo-live.sh $(BUILD)

bench: build
	tools/run-bench.sh $(BUILD)

format:
	clang-format -i $$(git ls-files '*.cpp' '*.h')

format-check:
	clang-format --dry-run -Werror $$(git ls-files '*.cpp' '*.h')

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD)
