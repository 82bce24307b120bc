# The trainfleet control plane: the `fleet` CLI for the workers, beat, Flower, the bot and the notifier
# (see docker-compose.yml). It never trains: the rented GPU nodes do. So it is the plain install, the control
# plane alone (requirements-fleet.txt: no torch, transformers or peft; tests/integration/test_control_install.py
# runs its CLI as installed so).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# git: `fleet watch` and `fleet enqueue --changed-since` read the configs' repository with it.
RUN apt-get update && apt-get install -y --no-install-recommends git \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY pyproject.toml README.md requirements-*.txt ./
COPY core ./core
COPY jobs ./jobs
COPY state ./state
COPY broker ./broker
COPY providers ./providers
COPY workers ./workers
COPY service ./service
COPY bot ./bot
COPY fleet ./fleet
COPY trainer ./trainer
RUN pip install .
# The example configs: the bot's /train finds configs by name under ./configs (FLEET_BOT_CONFIGS_DIR).
COPY configs ./configs

RUN useradd --create-home --uid 1000 fleet && mkdir -p /data/fleet && chown fleet /data/fleet
USER fleet
ENV FLEET_HOME=/data/fleet

CMD ["fleet", "--help"]
