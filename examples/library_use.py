"""mpicoll as a library: one call per algorithm, checked against the MPI library's own
(itself checked against the sum of the ranks), and one in place."""

import numpy as np

import mpicoll


def main() -> None:
    comm = mpicoll.Communicator()  # MPI.COMM_WORLD by default
    x = np.full(1000, comm.rank, dtype=np.float32)
    reference = comm.all_reduce(x, "sum", algorithm="native")  # MPI_Allreduce
    expected = np.full(1000, sum(range(comm.size)), dtype=np.float32)  # NumPy's answer
    if not np.array_equal(reference, expected):  # a check, not an assert: kept under -O
        raise AssertionError("MPI_Allreduce differs from the sum of the ranks")
    for name in mpicoll.algorithms("all_reduce"):
        total = comm.all_reduce(x, "sum", algorithm=name)
        if not np.array_equal(total, reference):
            raise AssertionError(f"{name} differs from MPI_Allreduce")
    comm.all_reduce(x, out=x)  # in place
    if not np.array_equal(x, expected):
        raise AssertionError("the in-place all_reduce differs from the sum of the ranks")
    if comm.rank == 0:
        print(f"{comm.size} ranks: sum = {x[0]:.0f}; "
              f"algorithms checked: {', '.join(mpicoll.algorithms('all_reduce'))}")


if __name__ == "__main__":
    # an uncaught exception on any rank ends the whole job (exit code 70), so no rank is
    # left waiting in a collective the failed one will never join
    mpicoll.abort_on_exception()
    main()
