"""The Flex Template launcher's entry: the converter's launcher, run as a script.

Not beam_jobs/convert.py itself: run as a script, its folder would come first on sys.path, and
beam_jobs/packaging.py would hide the `packaging` distribution that Beam imports.
"""

import sys

from beam_jobs import convert

if __name__ == "__main__":
    sys.exit(convert.main())
