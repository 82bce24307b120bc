# syntax=docker/dockerfile:1
#
# trainfleet's node image: what a rented GPU node (RunPod, vast.ai) runs. The node's software, once:
# trainer/requirements-node.txt (Ray, transformers, peft, ...) over the base image's CUDA build of torch,
# in a Python 3.11 venv at /opt/trainfleet/venv that is first on PATH (`python3`, `ray`, `jupyter` are its),
# plus an SSH server and JupyterLab for nodes kept for debugging. The trainer itself is not in the image:
# it comes with each Ray job (py_modules). Build and point a job at it:
#
#   make node-image                    # docker build -f docker/node.Dockerfile -t trainfleet-node:<version> .
#   runpod: / vastai: section          image: <registry>/trainfleet-node:<version>
#
# Base: the official PyTorch runtime image of the fleet's torch, pytorch/pytorch:<torch>-cuda<X.Y>-cudnn9-
# runtime (Ubuntu, conda at /opt/conda, torch from PyTorch's own CUDA wheels). Its torch is the one the
# fleet pins, built and tested by PyTorch against the CUDA and cuDNN in it, and its Python has been 3.11
# (the default of PyTorch's image build), the fleet's: the venv then sees the base's packages, so that torch
# is kept as it is and only what the base lacks is added. CUDA 12.8 by default: it runs Hopper (H100/H200),
# Blackwell (B200, RTX 50xx), Ada and Ampere, on the drivers rental hosts have (>= 570; older 12.x ones
# through CUDA's minor-version compatibility), where a CUDA 13 build needs >= 580. Another torch or CUDA:
# TORCH_VERSION and CUDA_VERSION name the base's tag; a BASE_IMAGE of your own must match TORCH_VERSION.
# Should the base's Python not be 3.11 (or BASE_IMAGE be a plain nvidia/cuda image, with TORCH_INDEX set),
# uv brings Python 3.11 and torch comes again for it: the same version and CUDA build, from PyTorch's index.
#
# Versions: the node's packages are constrained to NODE_PINS (the fleet's exact versions, `make node-image`
# passes them: providers.bootstrap.node_pins, what a node's start script checks the image against; an image
# that has them installs nothing at start) and Ray to RAY_VERSION (it must equal the fleet's).
#
# Users: root by default (the providers' volumes at /workspace are root's, and sshd needs root); the user
# `ray` (uid 1000) owns /workspace and /opt/trainfleet, so the image also runs as `--user 1000`.
# No ENTRYPOINT: the providers pass the container's command (`sh -c '<start script>'`), which starts Ray.

ARG TORCH_VERSION=2.13.0
ARG CUDA_VERSION=12.8
ARG BASE_IMAGE=pytorch/pytorch:${TORCH_VERSION}-cuda${CUDA_VERSION}-cudnn9-runtime
ARG UV_VERSION=0.13.8

FROM ghcr.io/astral-sh/uv:${UV_VERSION} AS uv

FROM ${BASE_IMAGE}

ARG TORCH_VERSION
ARG CUDA_VERSION
ARG PYTHON_VERSION=3.11
ARG RAY_VERSION=2.60.0
ARG TRAINFLEET_VERSION=0.1.0
# The fleet's pins, space-separated (`torch==2.13.0 ray[default,train]==2.60.0 transformers==...`); empty:
# only Ray is pinned. torch's is left out: the base's build is kept.
ARG NODE_PINS=""
# Where torch comes from when the base's cannot serve (another Python, no torch): PyTorch's index for the
# base's CUDA build (e.g. https://download.pytorch.org/whl/cu128); empty: derived from the base's torch.
ARG TORCH_INDEX=""
# Build time only (ARGs, not ENV: a node's own pip keeps its cache on the node's volume).
ARG DEBIAN_FRONTEND=noninteractive
ARG PIP_NO_CACHE_DIR=1
ARG PIP_DISABLE_PIP_VERSION_CHECK=1
ARG UV_PYTHON_INSTALL_DIR=/opt/trainfleet/python

LABEL org.opencontainers.image.title="trainfleet-node" \
      org.opencontainers.image.description="trainfleet's GPU node: Ray, torch (CUDA), transformers, peft" \
      org.opencontainers.image.version="${TRAINFLEET_VERSION}" \
      io.trainfleet.version="${TRAINFLEET_VERSION}" \
      io.trainfleet.ray-version="${RAY_VERSION}" \
      io.trainfleet.torch-version="${TORCH_VERSION}" \
      io.trainfleet.cuda-version="${CUDA_VERSION}" \
      io.trainfleet.python-version="${PYTHON_VERSION}"

ENV PYTHONUNBUFFERED=1
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# The SSH server of kept nodes (started by trainfleet-sshd below), and what `entry` scripts commonly use.
# No host keys are baked in (every node would share them): trainfleet-sshd makes the node's own. Not pinned:
# the base's Ubuntu release fixes them, and exact Debian versions would break at its next update.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends openssh-server ca-certificates curl git procps \
    && rm -rf /var/lib/apt/lists/* \
    && rm -f /etc/ssh/ssh_host_*_key /etc/ssh/ssh_host_*_key.pub \
    && mkdir -p /run/sshd /etc/ssh/sshd_config.d \
    && printf 'PasswordAuthentication no\nPermitRootLogin prohibit-password\n' \
        > /etc/ssh/sshd_config.d/trainfleet.conf

# The user `ray`, uid 1000 (an Ubuntu 24.04 base's `ubuntu` user, which holds that uid, makes way).
RUN set -eux; \
    other="$(getent passwd 1000 | cut -d: -f1 || true)"; \
    if [ -n "$other" ] && [ "$other" != ray ]; then userdel -r "$other" 2>/dev/null || userdel "$other"; fi; \
    getent passwd ray >/dev/null || useradd --create-home --uid 1000 --shell /bin/bash ray; \
    mkdir -p /workspace /opt/trainfleet; \
    chown ray:ray /workspace /opt/trainfleet

COPY --from=uv /uv /uvx /usr/local/bin/
COPY trainer/requirements-node.txt /opt/trainfleet/requirements-node.txt

# One layer: the venv, the node's packages and jupyterlab, their check, and ray's ownership of it all (a
# chown in a later layer would copy the venv).
RUN set -eux; set -f; \
    venv=/opt/trainfleet/venv; \
    base="$(command -v python3 || true)"; \
    base_minor=""; base_torch=""; \
    if [ -n "$base" ]; then \
        base_minor="$("$base" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"; \
        base_torch="$("$base" -c 'import torch; print(torch.__version__)' 2>/dev/null || true)"; \
    fi; \
    case "$base_torch" in \
        ""|"$TORCH_VERSION"|"$TORCH_VERSION"+*) ;; \
        *) echo "the base image has torch $base_torch, not $TORCH_VERSION: set BASE_IMAGE and TORCH_VERSION together" >&2; exit 1 ;; \
    esac; \
    if [ "$base_minor" = "$PYTHON_VERSION" ] && [ -n "$base_torch" ]; then \
        "$base" -m venv --system-site-packages "$venv"; \
    else \
        index="$TORCH_INDEX"; \
        case "$base_torch" in *+cu*) index="${index:-https://download.pytorch.org/whl/${base_torch#*+}}" ;; esac; \
        if [ -z "$index" ]; then echo "no torch to keep for Python $PYTHON_VERSION: set TORCH_INDEX" >&2; exit 1; fi; \
        uv python install "$PYTHON_VERSION"; \
        uv venv --seed --python "$PYTHON_VERSION" "$venv"; \
        "$venv/bin/python" -m pip install --index-url "$index" --extra-index-url https://pypi.org/simple \
            "torch==${base_torch:-$TORCH_VERSION}"; \
    fi; \
    torch_now="$("$venv/bin/python" -c 'import torch; print(torch.__version__)')"; \
    { echo "torch==$torch_now"; echo "ray==$RAY_VERSION"; \
      for pin in $NODE_PINS; do \
          case "$pin" in torch==*|torch\[*) ;; *) echo "$pin" | sed 's/\[[^]]*\]//' ;; esac; \
      done; } > /opt/trainfleet/constraints.txt; \
    "$venv/bin/python" -m pip install --upgrade pip; \
    "$venv/bin/python" -m pip install -r /opt/trainfleet/requirements-node.txt jupyterlab \
        -c /opt/trainfleet/constraints.txt; \
    "$venv/bin/python" -c "import sys, torch, ray, transformers, peft; \
assert '%d.%d' % sys.version_info[:2] == '$PYTHON_VERSION', sys.version; \
assert torch.__version__ == '$torch_now' and torch.version.cuda, ('torch', torch.__version__, torch.version.cuda); \
assert ray.__version__ == '$RAY_VERSION', ('ray', ray.__version__); \
print('node image: python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'ray', ray.__version__)"; \
    "$venv/bin/ray" --version; \
    "$venv/bin/jupyter" lab --version; \
    chown -R ray:ray /opt/trainfleet

ENV VIRTUAL_ENV=/opt/trainfleet/venv \
    PATH=/opt/trainfleet/venv/bin:${PATH}

# sshd for a kept node: the fleet's key ($PUBLIC_KEY, as RunPod's images read it) in root's
# authorized_keys, this node's own host keys, then sshd (it daemonizes). Without PUBLIC_KEY it does nothing.
COPY --chmod=755 <<'EOF' /usr/local/bin/trainfleet-sshd
#!/bin/sh
set -eu
if [ -z "${PUBLIC_KEY:-}" ]; then echo "trainfleet-sshd: no PUBLIC_KEY, no sshd" >&2; exit 0; fi
if [ "$(id -u)" != 0 ]; then echo "trainfleet-sshd: sshd needs root" >&2; exit 1; fi
umask 077
mkdir -p /root/.ssh
grep -qxF "$PUBLIC_KEY" /root/.ssh/authorized_keys 2>/dev/null || printf '%s\n' "$PUBLIC_KEY" >> /root/.ssh/authorized_keys
ssh-keygen -A >/dev/null
mkdir -p /run/sshd
exec /usr/sbin/sshd
EOF

WORKDIR /workspace
EXPOSE 22 6379 8265 8888
ENTRYPOINT []
CMD ["bash"]
