/*
 * dfccld settings: one declarative table (config.c) of every setting with
 * its type, bounds, default and help. The table drives the config file
 * parser, the environment (DFCCLD_<NAME>, dashes as underscores), the command
 * line (--name VALUE or --name=VALUE) and --help. Later sources override
 * earlier ones: defaults, then the file, then the environment, then the
 * command line.
 */
#ifndef DFCCLD_CONFIG_H
#define DFCCLD_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum dfccld_engine { DFCCLD_ENGINE_AUTO = 0, DFCCLD_ENGINE_HOST = 1, DFCCLD_ENGINE_CUDA = 2 };

#define DFCCLD_DEFAULT_CONFIG "/etc/dfccl/dfccld.conf"

struct dfccld_config {
	char socket_path[108]; /* sizeof(sun_path) */
	char config_file[256];
	char topology_file[256];
	char tuning_file[256];
	int algo;              /* enum topo_force: auto, direct, ring, tree, multitree */
	int engine;            /* enum dfccld_engine */
	int64_t host_devices;
	char host_pci_bus_ids[1024]; /* comma-separated, one per emulated device; empty: none */
	int log_level;         /* enum log_level */
	int log_target;        /* enum log_target */
	int64_t max_sessions_per_uid;
	int64_t max_registered_bytes_per_uid;
	int64_t max_comms_per_uid;
	int64_t comm_init_timeout_ms;
	int64_t sq_entries;
	int64_t worker_restart_delay_ms;
	int64_t worker_start_timeout_ms;
	int64_t shutdown_grace_ms;
	int worker_user;       /* enum worker_user_setting: auto, daemon, job */
	int64_t spin_head;     /* scheduler: spin threshold of the head of the task queue */
	int64_t spin_other;    /* scheduler: spin threshold of the other tasks */
	int64_t stick_mult;    /* scheduler: threshold multiplier after progress */
	int64_t spin_max;      /* scheduler: the largest threshold */
	int64_t channels;      /* cuda engine: blocks of the daemon kernel */
	int64_t channels_mps;  /* the same under MPS */
	int64_t spread_blocks; /* cuda engine: 1: collectives start on blocks chosen by their instance */
	int64_t kernel_idle_us; /* cuda engine: idle time before the daemon kernel quits */
	int64_t kernel_idle_mps_us; /* the same under MPS */
	int64_t resident_blocks;    /* cuda engine: blocks of the resident grid (0: the kernel is one grid) */
	int64_t resident_blocks_mps; /* the same under MPS */
	int64_t bulk_idle_us;       /* cuda engine: idle time before a bulk block leaves */
	int64_t launch_gate;        /* cuda engine: 1: a stopped kernel's launch waits for the next stream's arm */
	int64_t launch_gate_mps;    /* the same under MPS */
	int64_t launch_gate_idle_us; /* cuda engine with a gate: idle time before the kernel quits after
	                              * stream-ordered collectives only */
	int64_t early_take;     /* cuda engine: 1: stream-ordered entries may be taken before their arm */
	int64_t push_bytes;     /* cuda engine: largest pushed all-reduce (0: none) */
	int64_t ll_bytes;       /* cuda engine: largest pushed all-reduce sent as flagged lines (0: none) */
	int64_t chan_bytes;     /* cuda engine: a channel per this many bytes of a collective */
	int64_t oneshot_bytes;  /* cuda engine: largest one-shot all-reduce on more than two ranks (0: none at all) */
	int64_t visit_bytes;    /* bytes a channel moves per visit before it yields */
	int64_t coll_timeout_ms;    /* default collective timeout of a communicator (0: none) */
	int64_t watch_interval_ms;  /* the watcher's sampling tick (daemon/watch.h) */
	int64_t heartbeat_stale_ms; /* a client heartbeat older than this reads as stopped */
	int64_t flight_recorder_entries; /* collectives kept per rank (0: no recorder) */
	int64_t flight_recorder_keep;    /* recorders kept after their communicator is gone */
	char flight_recorder_dir[256];   /* where a timed-out communicator's recorder is written ("": nowhere) */
	int64_t hello_timeout_ms;          /* a connection that never says Hello is closed after this */
	int64_t max_inflight_per_session;  /* collectives one queue pair may have in a device's engine */
	int64_t max_inflight_per_uid;      /* collectives the queue pairs of one uid may have in a device's engine */
	int64_t max_regs_per_session;
	int64_t max_regs_per_uid;
	int64_t max_comms_per_session;
	int64_t max_qps_per_uid;
	int64_t fd_reserve;                /* descriptors kept for new connections (dfcclctl included) */
};

/* Fills cfg with every default. */
void config_defaults(struct dfccld_config *cfg);

/*
 * Sets one setting by name from text, checking type and bounds. Returns 0, or
 * -EINVAL / -ERANGE / -ENOENT (unknown name) with a sentence in err.
 */
int config_set(struct dfccld_config *cfg, const char *name, const char *value, char *err, size_t errlen);

/* Reads "name = value" lines ('#' comments). A missing file is not an error
 * unless `required`. Returns 0 or a negative errno with a sentence in err. */
int config_load_file(struct dfccld_config *cfg, const char *path, int required, char *err, size_t errlen);

/* Applies DFCCLD_<NAME> variables from the environment. */
int config_load_env(struct dfccld_config *cfg, char *err, size_t errlen);

/*
 * The whole sequence for dfccld's main: defaults, file (--config or
 * DFCCLD_CONFIG, else DFCCLD_DEFAULT_CONFIG if present), environment, command
 * line. Returns 0 to run, 1 when --help or --version was printed (exit 0), or
 * a negative errno with a sentence in err (exit 2).
 */
int config_parse(struct dfccld_config *cfg, int argc, char **argv, char *err, size_t errlen);

/* Prints the usage line and one entry per setting (name, default, bounds, help). */
void config_print_help(FILE *f, const char *argv0);

/* The value of setting `name` as text (what config_set would accept back).
 * Returns 0, or -ENOENT for an unknown name. */
int config_format(const struct dfccld_config *cfg, const char *name, char *buf, size_t len);

/* The setting whose value stands for `name` under MPS: its MPS twin
 * (kernel-idle-mps-us for kernel-idle-us, channels-mps for channels), else
 * `name` itself. */
const char *config_mps_twin(const char *name);

/* The settings an engine worker reads, by name (*n of them): the
 * supervisor passes each to the workers it starts (workers.c), the MPS
 * twin's value under MPS. A setting left out keeps its default in the
 * workers whatever dfccld was given; every setting of the CUDA engine (its
 * help starts "cuda engine") is one of them or the twin of one
 * (test_config checks it). */
const char *const *config_worker_settings(size_t *n);

/* The i-th setting's name and help: 0, or -1 past the last. */
int config_setting_at(size_t i, const char **name, const char **help);

/* Writes "name value" for every setting, for diagnostics. */
void config_dump(const struct dfccld_config *cfg, FILE *f);

const char *config_engine_name(int engine);

#endif /* DFCCLD_CONFIG_H */
