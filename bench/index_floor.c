/* The native floor of listing a bookie's entries: RocksDB's own iteration over a DbLedgerStorage
 * `locations` index, per ledger, each entry's id and the entry log its location names decoded, through
 * RocksDB's C API (Debian's librocksdb), opened as a secondary of the live bookie the way the agent opens
 * it. Built and run by bench/agent_index.py:
 *
 *   index_floor <locations dir> <secondary dir> <block cache MiB> <passes> <ledger id>...
 *
 * Prints "<entries listed> <CPU seconds>" for every pass, a line each. */
#include <rocksdb/c.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static void key_of(unsigned char *k, int64_t ledger, uint64_t entry) {
    for (int i = 0; i < 8; i++) k[i] = (unsigned char)((uint64_t)ledger >> (56 - 8 * i));
    for (int i = 0; i < 8; i++) k[8 + i] = (unsigned char)(entry >> (56 - 8 * i));
}

static double cpu_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: %s <locations dir> <secondary dir> <block cache MiB> <passes> <ledger id>...\n",
                argv[0]);
        return 2;
    }
    char *err = NULL;
    rocksdb_options_t *options = rocksdb_options_create();
    rocksdb_options_set_max_open_files(options, -1);
    rocksdb_block_based_table_options_t *table = rocksdb_block_based_options_create();
    rocksdb_cache_t *cache = rocksdb_cache_create_lru((size_t)atoll(argv[3]) << 20);
    rocksdb_block_based_options_set_block_cache(table, cache);
    rocksdb_options_set_block_based_table_factory(options, table);
    rocksdb_t *db = rocksdb_open_as_secondary(options, argv[1], argv[2], &err);
    if (err) { fprintf(stderr, "open: %s\n", err); return 1; }
    rocksdb_try_catch_up_with_primary(db, &err);
    if (err) { fprintf(stderr, "catch up: %s\n", err); return 1; }
    int passes = atoi(argv[4]);
    int64_t checksum = 0;
    for (int pass = 0; pass < passes; pass++) {
        long long listed = 0;
        double t0 = cpu_seconds();
        for (int a = 5; a < argc; a++) {
            int64_t ledger = atoll(argv[a]);
            unsigned char lo[16], hi[16];
            key_of(lo, ledger, 0);
            key_of(hi, ledger, 0x8000000000000000ULL); /* negative (special) entry ids sort above the rest */
            rocksdb_readoptions_t *ro = rocksdb_readoptions_create();
            rocksdb_readoptions_set_iterate_upper_bound(ro, (const char *)hi, 16);
            rocksdb_iterator_t *it = rocksdb_create_iterator(db, ro);
            for (rocksdb_iter_seek(it, (const char *)lo, 16); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
                size_t n;
                const unsigned char *k = (const unsigned char *)rocksdb_iter_key(it, &n);
                uint64_t entry = 0, location = 0;
                for (int i = 8; i < 16; i++) entry = entry << 8 | k[i];
                const unsigned char *v = (const unsigned char *)rocksdb_iter_value(it, &n);
                for (size_t i = 0; i < n && i < 8; i++) location = location << 8 | v[i];
                checksum += (int64_t)entry + (int64_t)(location >> 32); /* the id and the log, as a listing must */
                listed++;
            }
            rocksdb_iter_destroy(it);
            rocksdb_readoptions_destroy(ro);
        }
        printf("%lld %.6f\n", listed, cpu_seconds() - t0);
    }
    if (checksum == 42) fprintf(stderr, "\n"); /* the ids are used: nothing is optimised away */
    rocksdb_close(db);
    rocksdb_options_destroy(options);
    return 0;
}
