/*
 * A stand-in for Windows' bcryptprimitives.dll, for running the Windows test
 * executables under Wine 8, which lacks it: Rust's standard library imports
 * `ProcessPrng` from it for random numbers (hash map keys, temporary file
 * names). This forwards to `RtlGenRandom` (advapi32's `SystemFunction036`),
 * which Wine has. Built by scripts/wine-test.sh with mingw-w64; found
 * through WINEPATH. Never shipped: real Windows has its own.
 */
#include <windows.h>

BOOLEAN WINAPI SystemFunction036(PVOID buffer, ULONG length);

/* Fills `length` bytes at `data` with random bytes; TRUE on success. */
BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T length)
{
    while (length > 0) {
        ULONG chunk = length > 0x40000000 ? 0x40000000 : (ULONG)length;
        if (!SystemFunction036(data, chunk))
            return FALSE;
        data += chunk;
        length -= chunk;
    }
    return TRUE;
}
