# kbatch consumer image. torch comes from PyPI (a CUDA build that also runs on CPUs).
FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
# The dependencies first, in a layer that changes only with pyproject.toml or the lock: the
# client's, the [serve] extra (torch, transformers, ONNX Runtime) and the [otel] extra
# (OpenTelemetry tracing, --tracing, docs/TRACING.md), each at the version requirements.lock
# pins (`make lock`, what `make setup` installs; -c pins without installing its dev tools).
COPY pyproject.toml requirements.lock ./
RUN --mount=type=cache,target=/root/.cache/pip \
    python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; e = p['optional-dependencies']; print('\n'.join(p['dependencies'] + e['serve'] + e['otel']))" > /tmp/requirements.txt \
    && pip install -c requirements.lock -r /tmp/requirements.txt
COPY README.md ./
COPY consumer ./consumer
COPY producer_tools ./producer_tools
COPY schemas ./schemas
RUN pip install --no-deps .
USER nobody
EXPOSE 9400
ENTRYPOINT ["kbatch"]
CMD ["serve"]
