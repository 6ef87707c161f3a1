# chatlab: `make demo` runs the main job, `make test` the tests; both set up first.
PY := .venv/bin/python

.PHONY: setup demo test lint format bench proto memory auth-bench clean

setup:
	@scripts/setup.sh

demo: setup
	$(PY) scripts/demo.py

test: setup
	$(PY) -m pytest -q
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

# chat server memory per idle connection, deflate off and on
memory: setup
	$(PY) -m bench.memory

# logins/s with the hashing pool vs argon2 inline on the event loop, and the loop's lateness
auth-bench: setup
	$(PY) -m bench.auth_login

# regenerate chat_server/codecs/chat_pb2.py from proto/chat.proto (grpcio-tools is pinned)
proto: setup
	$(PY) -m grpc_tools.protoc -Iproto --python_out=chat_server/codecs \
		--pyi_out=chat_server/codecs proto/chat.proto

clean:
	rm -rf .pytest_cache .ruff_cache .tox build *.egg-info
