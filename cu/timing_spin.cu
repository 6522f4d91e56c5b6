// Benchmark helper, not a library kernel: one thread waits `ns` nanoseconds on the GPU clock.
// Launched ahead of a timed batch, it keeps the GPU busy while Python enqueues the batch, so the
// events around the batch measure GPU time rather than host launch overhead.
extern "C" __global__ void spin(const long long ns)
{
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < (unsigned long long)ns);
}

extern "C" __global__ void empty_kernel() {}
