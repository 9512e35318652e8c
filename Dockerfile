# kbatch consumer image. torch comes from PyPI (a CUDA build that also runs on CPUs).
FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY consumer ./consumer
COPY producer_tools ./producer_tools
COPY schemas ./schemas
# [otel]: OpenTelemetry tracing (--tracing, docs/TRACING.md); kbatch runs without it.
RUN --mount=type=cache,target=/root/.cache/pip pip install '.[otel]'
USER nobody
EXPOSE 9400
ENTRYPOINT ["kbatch"]
CMD ["serve"]
