# Workers with everything installed, for --sdk_container_image: needed with
# --no_use_public_ips (workers without a public IP cannot pip-install from PyPI), and it
# makes every worker start faster. Use the Beam SDK image of the apache-beam version you
# launch with (constraints.txt's, 2.77.0 here) and your Python; packages install at the
# versions the suite passed with. The workers of the conversion and of `verify` need the
# [beam] extra only (`verify --decode`'s need [all]: --build-arg EXTRAS=all).
FROM apache/beam_python3.11_sdk:2.77.0
ARG EXTRAS=beam

COPY . /src
RUN pip install --no-cache-dir -c /src/constraints.txt "/src[${EXTRAS}]"
