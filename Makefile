# chatlab: `make demo` runs the main job, `make test` the tests; both set up first.
PY := .venv/bin/python

.PHONY: setup demo lab talk test lint format bench microbench proto memory auth-bench loadtest loadtest-services relay clean

setup:
	@scripts/setup.sh

# the lab's demo matrix, ending in reports/<time>-demo/report.html
demo: setup
	$(PY) -m bench.lab run --matrix demo

# any lab matrix: make lab MATRIX=serializers ARGS="--repeat 3"
MATRIX ?= demo
lab: setup
	$(PY) -m bench.lab run --matrix $(MATRIX) $(ARGS)

# a scripted chat: two users talk through a real server, with tokens it mints itself
talk: setup
	$(PY) scripts/demo.py

test: setup
	$(PY) -m pytest -q -n 2 -m 'not owns_machine'
	$(PY) -m pytest -q -m owns_machine
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

format: setup
	.venv/bin/ruff format .
	.venv/bin/ruff check --fix .

# codec encode+decode time and frame size per serializer (ratios to json)
bench: setup
	$(PY) -m bench.codecs

# pytest-benchmark: json/orjson/protobuf side by side, then the seed-style table
microbench: setup
	mkdir -p reports
	$(PY) -m pytest bench/ --benchmark-only --benchmark-json=reports/microbench.json
	$(PY) -m bench.seed_table reports/microbench.json

# chat server memory per connection, deflate off, on and shared (idle; --traffic after too)
memory: setup
	$(PY) -m bench.memory

# logins/s with the hashing pool vs argon2 inline on the event loop, and the loop's lateness
auth-bench: setup
	$(PY) -m bench.auth_login

# Locust load test of the running chat server + auth service (web UI on :8089 unless
# ARGS has --headless), e.g. make loadtest ARGS="--headless --load-profile smoke"
loadtest: setup
	$(PY) -m locust -f loadtest/chat.py $(ARGS)

# both services for a load test from one address (the auth service's per-address limits
# off), until Ctrl-C; then, in another terminal: make loadtest ARGS="--headless --load-profile smoke"
loadtest-services: setup
	@scripts/loadtest-services.sh

# a relay that does the least work, to measure the load generator (loadtest/README.md)
relay: setup
	$(PY) -m bench.relay $(ARGS)

# regenerate chat_server/codecs/chat_pb2.py from proto/chat.proto (grpcio-tools is pinned)
proto: setup
	$(PY) -m grpc_tools.protoc -Iproto --python_out=chat_server/codecs \
		--pyi_out=chat_server/codecs proto/chat.proto
	$(PY) -m grpc_tools.protoc -Ibench --python_out=bench --pyi_out=bench bench/seed.proto

clean:
	rm -rf .pytest_cache .ruff_cache .tox build *.egg-info
