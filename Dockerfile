# One image for every process of the stack: `relay`, `consumer`, `alembic`, the demo.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

WORKDIR /app
RUN useradd --create-home --uid 10001 app

# Dependencies first, so a code change does not reinstall them.
COPY pyproject.toml README.md ./
COPY schema/__init__.py schema/
COPY outbox/__init__.py outbox/
COPY relay/__init__.py relay/
COPY consumers/__init__.py consumers/
COPY plumbing/__init__.py plumbing/
RUN pip install . && pip uninstall -y hybrid-jobs

COPY . .
RUN pip install --no-deps .

USER app
CMD ["relay"]
