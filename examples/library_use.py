"""mpicoll as a library: one call per algorithm, checked against the MPI library's own."""

import numpy as np

import mpicoll


def main() -> None:
    comm = mpicoll.Communicator()  # MPI.COMM_WORLD by default
    x = np.full(1000, comm.rank, dtype=np.float32)
    reference = comm.all_reduce(x, "sum", algorithm="native")  # MPI_Allreduce
    for name in mpicoll.algorithms("all_reduce"):
        total = comm.all_reduce(x, "sum", algorithm=name)
        assert np.array_equal(total, reference), name
    comm.all_reduce(x, out=x)  # in place
    if comm.rank == 0:
        print(f"{comm.size} ranks: sum = {x[0]:.0f}; "
              f"algorithms checked: {', '.join(mpicoll.algorithms('all_reduce'))}")


if __name__ == "__main__":
    # an uncaught exception on any rank ends the whole job (exit code 70), so no rank is
    # left waiting in a collective the failed one will never join
    mpicoll.abort_on_exception()
    main()
