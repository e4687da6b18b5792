# Prometheus for the compose stack where prom/prometheus cannot be pulled: Debian's own
# build (the `prometheus` package) on the debootstrap'd bookworm that docker/image.sh
# imports, started as the official image starts it. Its context is docker/base (sources.list).
ARG ROOTFS=localhost/aserve-bookworm-rootfs:minbase
FROM ${ROOTFS}
COPY sources.list /etc/apt/sources.list
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /prometheus \
 && chown nobody:nogroup /prometheus
USER nobody
WORKDIR /prometheus
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
