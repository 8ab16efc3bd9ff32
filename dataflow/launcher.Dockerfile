# The Flex Template's launcher image: it runs the converter's launcher with the template's
# parameters as flags; the launcher checks them, claims the output folder, submits the job and
# returns. The job's last step finalises the dataset. Build and run: docs/dataflow.md.
FROM gcr.io/dataflow-templates-base/python311-template-launcher-base

COPY . /template/src
# The job's extra only: launching needs no TensorFlow.
RUN pip install --no-cache-dir -c /template/src/constraints.txt "/template/src[beam]"
ENV FLEX_TEMPLATE_PYTHON_PY_FILE=/template/src/beam_jobs/convert.py
