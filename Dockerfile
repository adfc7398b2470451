# One image for every process of the stack: `relay`, `consumer`, `alembic`, the demo.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

WORKDIR /app
RUN useradd --create-home --uid 10001 app

# The dependencies first, from pyproject.toml alone, in a layer of their own: a
# change to the code does not reinstall them.
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt

COPY . .
RUN pip install --no-deps .

# Where compose.yaml keeps the API token it makes: owned by app, so that a new
# volume mounted here is too (Docker copies the directory's owner and mode into it).
RUN install -d -o app -g app -m 700 /var/lib/hybrid-jobs

USER app
CMD ["relay"]
