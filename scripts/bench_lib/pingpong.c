/* MPI ping-pong between ranks 0 and 1 (scripts/bench, tests/integration/test_pod_slurm.py).
 *
 *     pingpong ITERS [SIZE...]      default sizes: 8 and 1048576 bytes
 *
 * Prints one line per size from rank 0:
 *     pingpong SIZE ITERS LAT_US MB_S
 * LAT_US is half the mean round trip, MB_S is SIZE / LAT_US.  Every message
 * is checked (a pattern that depends on the iteration), so a transport that
 * copies the wrong memory fails the run (exit 3) instead of looking fast. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int check(const unsigned char *buf, size_t n, int it)
{
    for (size_t i = 0; i < n; i += 4093)
        if (buf[i] != (unsigned char)(i + it))
            return 0;
    return buf[n - 1] == (unsigned char)(n - 1 + it);
}

static void fill(unsigned char *buf, size_t n, int it)
{
    for (size_t i = 0; i < n; i += 4093)
        buf[i] = (unsigned char)(i + it);
    buf[n - 1] = (unsigned char)(n - 1 + it);
}

int main(int argc, char **argv)
{
    int rank, size, iters = argc > 1 ? atoi(argv[1]) : 1000;
    size_t sizes[16] = {8, 1 << 20};
    int nsizes = 2;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc > 2) {
        nsizes = 0;
        for (int i = 2; i < argc && nsizes < 16; i++)
            sizes[nsizes++] = strtoull(argv[i], NULL, 10);
    }
    if (size < 2 || iters < 1) {
        if (rank == 0)
            fprintf(stderr, "pingpong: needs 2 ranks and ITERS >= 1\n");
        MPI_Finalize();
        return 2;
    }
    int bad = 0;
    for (int s = 0; s < nsizes; s++) {
        MPI_Barrier(MPI_COMM_WORLD);
        if (rank >= 2)
            continue;                 /* only ranks 0 and 1 play */
        size_t n = sizes[s] ? sizes[s] : 1;
        unsigned char *buf = malloc(n);
        memset(buf, 0, n);
        int peer = 1 - rank;
        double t0 = 0;
        for (int warm = -10; warm < iters; warm++) {
            if (warm == 0)
                t0 = MPI_Wtime();
            int it = warm + 10;
            if (rank == 0) {
                fill(buf, n, it);
                MPI_Send(buf, (int)n, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
                MPI_Recv(buf, (int)n, MPI_BYTE, peer, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                bad |= !check(buf, n, it + 1);
            } else {
                MPI_Recv(buf, (int)n, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                bad |= !check(buf, n, it);
                fill(buf, n, it + 1);
                MPI_Send(buf, (int)n, MPI_BYTE, peer, 2, MPI_COMM_WORLD);
            }
            if (warm == iters - 1 && rank == 0) {
                double lat = (MPI_Wtime() - t0) / iters / 2 * 1e6;
                printf("pingpong %zu %d %.3f %.1f\n", n, iters, lat, n / lat);
                fflush(stdout);
            }
        }
        free(buf);
    }
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (bad && rank == 0)
        fprintf(stderr, "pingpong: a message arrived corrupted\n");
    MPI_Finalize();
    return bad ? 3 : 0;
}
