/* dquantd disk tier: the record files behind the store's disk tier (store.h), one per sequence or
 * chunk, in one directory (--disk-dir), in the format of diskrec.h.
 *
 * Files. A record of (kind, namespace, key) is named by the XXH3-128 of those (32 hex digits +
 * ".dqr"), so an entry has one file at most. It is written to "NAME.STAMP.tmp" by the workers (one
 * task per layer, pwritev straight from the layer's window records and tail), its meta last, then
 * renamed into place: a record is either absent or complete, and a crash leaves at most .tmp files,
 * removed at the next start. Reads come back on the workers too, layer by layer, each checked
 * against its XXH3 (which proves the bytes are those written, records that passed the container
 * check when first stored) and then restored without decoding every container again
 * (dq_layer_restore_unchecked). Removal (a write
 * made the record stale, DELETE, capacity) unlinks the file on the loop thread before the request
 * that caused it is answered. With --disk-sync on, a record is fdatasync'ed before its rename and
 * the directory fsync'ed after each rename and unlink.
 *
 * Guarantee after a crash (kill -9; power loss too with --disk-sync on): every entry is either
 * absent or exactly as after its last acknowledged write (or after a write in flight when the
 * daemon died) — never an older version, a part of a write, data DELETE removed or a corrupt
 * record. What was only in memory is lost (writes are not durable on their acknowledgement); what
 * was on disk and not made stale since comes back.
 *
 * Start-up (dqd_disktier_open, before the listeners): every record's meta is read and checked
 * (its layers are checked when read back), its model registered from the spec in it, and it goes
 * into the store as a stub, least recently written first; sequences built on chunks find their
 * chunks again (else they are dropped); records past the capacity are removed, oldest first.
 * A clean shutdown (dqd_disktier_flush) writes every sequence held in memory (host or GPU) that
 * has no record yet, so a restart keeps the whole cache. On the cuda backend only host eviction
 * spills: the GPU tier's victims go to host memory as before (or are dropped when it has no room)
 * and reach the disk from there.
 *
 * A model registered with a KVQ calibration (registry.h) has it written once beside its records
 * ("kvqcal-HASH.dqkc", before its first record is published), so that a restart registers the
 * model again with it; records whose calibration file is missing or refused are dropped.
 *
 * Loop thread only, except the tasks it runs on the workers. */
#ifndef DQD_DISKTIER_H
#define DQD_DISKTIER_H

#include <stdint.h>

typedef struct dqd_ctx dqd_ctx;
typedef struct dqd_disktier dqd_disktier;

/* Opens (or creates) ctx->cfg->disk_dir, recovers what is in it into ctx's store and registry (as
 * above) and turns the store's disk tier on. DQ_IO when the directory cannot be created or opened,
 * DQ_NOMEM. Records that fail their checks are removed and counted (disk_corrupt). When *out is set
 * (even on failure) it is freed with dqd_disktier_free after the store. */
int dqd_disktier_open(dqd_ctx *ctx, dqd_disktier **out);
/* Writes every committed sequence in memory (host or GPU) that has no record (no work may be in
 * flight: after the event loop has stopped). */
void dqd_disktier_flush(dqd_disktier *d);
/* After the store is gone (it hands its records back through the tier); NULL is allowed. */
void dqd_disktier_free(dqd_disktier *d);

#endif
