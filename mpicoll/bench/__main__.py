import sys

import mpicoll

from . import main

# a rank that raises (or a thread of it) ends the whole job at once, exit code 70, with
# or without `python -m mpi4py` in front; on success it changes nothing
mpicoll.abort_on_exception()
sys.exit(main())
