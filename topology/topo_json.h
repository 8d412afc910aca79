/*
 * Topology in JSON: model files, tuning files and the document dfcclctl
 * shows.
 *
 * A model file (what `dfccld --topology FILE` loads and `dfcclctl topo
 * --dump` prints):
 *
 *   {"version": 1, "name": "dgx1",
 *    "devices": [{"index": 0, "name": "...", "pci_bus_id": "0000:06:00.0",
 *                 "numa_node": 0, "cpu_affinity": "0-19,40-59"}, ...],
 *    "links": [{"a": 0, "b": 1, "type": "nvlink", "nvlinks": 1, "nvlink_gen": 2,
 *               "bw_gbps": 25, "lat_us": 0.7}, ...],
 *    "nics": [{"name": "mlx5_0", "pci_bus_id": "...", "numa_node": 0, "bw_gbps": 12.5}]}
 *
 * Loading is strict, because a model silently misread makes every
 * algorithm decision wrong: unknown fields, missing required fields, values
 * out of range, a device index that is not its position, a pair of devices
 * without a link or with two, all fail with a sentence that names the
 * field (`links[3].type: "nvlnk" is not one of ...`). Required: version,
 * devices[].index, links[].a/b/type/bw_gbps/lat_us, links[].nvlinks for
 * NVLink types, nics[].name/bw_gbps. Link types: nvlink, nvswitch, pix,
 * pxb, phb, node, sys, host. A whole topology document (below) loads too:
 * its "model" member is the model.
 *
 * A tuning file overrides selection-table entries:
 *
 *   {"version": 1, "entries": [{"coll": "allreduce", "nranks": 8,
 *     "min_bytes": 0, "max_bytes": 65536, "algo": "tree", "channels": 2}]}
 *
 * coll is a collective name or "*" (every collective that can run the
 * algorithm); nranks 0 or absent means every rank count; min_bytes absent
 * means 0 and max_bytes absent means no limit; an entry applies to the size
 * buckets that lie entirely within [min_bytes, max_bytes]. The "selection"
 * member of the topology document has this same form (plus "tuned" flags
 * and the cost-model "params", both ignored on load), so a table shown by
 * dfcclctl can be edited and loaded back as a tuning file.
 *
 * The topology document (QUERY_TOPOLOGY): {"model": ..., "rings": [{"order":
 * [...], "bw_gbps": x}], "trees": [{"root": r, "height": h, "bw_gbps": x,
 * "parent": [...], "level": [...]}], "selection": {...}}.
 */
#ifndef DFCCL_TOPO_JSON_H
#define DFCCL_TOPO_JSON_H

#include <jansson.h>
#include <stddef.h>

#include "topo_model.h"
#include "topo_ring.h"
#include "topo_select.h"
#include "topo_tree.h"

/* Parses a model (or a document holding one) from text / from a file.
 * Returns 0, -EINVAL (invalid: err says what and where), -ENOENT or another
 * errno from opening the file, or -ENOMEM. */
int topo_json_parse(const char *text, struct topo_model **out, char *err, size_t errlen);
int topo_json_load_file(const char *path, struct topo_model **out, char *err, size_t errlen);
int topo_json_from(const json_t *j, struct topo_model **out, char *err, size_t errlen);

/* The model as JSON (a new reference; NULL on allocation failure), and as
 * indented text ending in a newline (malloc'd; NULL on failure). */
json_t *topo_json_model(const struct topo_model *m);
char *topo_json_dump(const struct topo_model *m);

/* The selection table as JSON: merged size ranges per collective and rank
 * count, in the tuning file's form. */
json_t *topo_json_select_table(const struct topo_select_table *t);

/* Applies a tuning file (text, or a file) to the table. Returns the number
 * of entries applied, or -EINVAL with err naming the bad field. text_out,
 * when not NULL, receives the file's text once it applied (malloc'd), for
 * the tables of communicators built later. */
int topo_json_apply_tuning(struct topo_select_table *t, const char *text, char *err, size_t errlen);
int topo_json_load_tuning(struct topo_select_table *t, const char *path, char **text_out, char *err, size_t errlen);

/* Reads a whole file into a NUL-terminated buffer (*text, malloc'd);
 * returns 0 or a negative errno with a sentence naming the file in err.
 * (Every JSON file the tools load is read with it.) */
int topo_json_read_file(const char *path, char **text, char *err, size_t errlen);

/* The whole topology document as compact text (malloc'd; NULL on failure). */
char *topo_json_document(const struct topo_model *m, const struct topo_ring *rings, unsigned nrings,
                         const struct topo_tree *trees, unsigned ntrees, const struct topo_select_table *t);

#endif /* DFCCL_TOPO_JSON_H */
