# Locust for the compose stack where locustio/locust cannot be pulled: the version the
# compose file names, from PyPI, on the Python base docker/image.sh used; started as the
# official image starts it (`locust` is the entry point, the compose command its arguments).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
FROM ${PYTHON_IMAGE}
ARG LOCUST_VERSION
RUN pip install --no-cache-dir "locust==${LOCUST_VERSION}" \
 && useradd --create-home --uid 1000 --shell /usr/sbin/nologin locust
USER locust
WORKDIR /home/locust
EXPOSE 8089
ENTRYPOINT ["locust"]
