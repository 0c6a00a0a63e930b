/*
 * A qemu TCG plugin that counts guest instructions, deterministically.
 *
 * Every translated block gets an inline "add n_insns" to one counter when it
 * executes, so the count does not depend on timing. At exit the total is
 * printed as "insns: N" (to qemu's log, i.e. stderr), or written to the file
 * named by the plugin argument out=PATH.
 *
 * Build: gcc -O2 -shared -fPIC -o libinsn_count.so insn_count.c
 * Use:   qemu-aarch64 -plugin ./libinsn_count.so,out=count.txt ./program
 *
 * The few declarations of qemu's plugin API (version 1, qemu 7.x) are written
 * out here because Debian ships no qemu-plugin.h.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef uint64_t qemu_plugin_id_t;
struct qemu_plugin_tb;
typedef struct {
    const char *target_name;
    int version_min, version_cur;
    int system_emulation;
    union {
        struct { int smp_vcpus, max_vcpus; } system;
    };
} qemu_info_t;
enum qemu_plugin_op { QEMU_PLUGIN_INLINE_ADD_U64 };

typedef void (*qemu_plugin_vcpu_tb_trans_cb_t)(qemu_plugin_id_t id, struct qemu_plugin_tb *tb);
typedef void (*qemu_plugin_udata_cb_t)(qemu_plugin_id_t id, void *userdata);

extern void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t id, qemu_plugin_vcpu_tb_trans_cb_t cb);
extern size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *tb);
extern void qemu_plugin_register_vcpu_tb_exec_inline(struct qemu_plugin_tb *tb, enum qemu_plugin_op op,
                                                     void *ptr, uint64_t imm);
extern void qemu_plugin_register_atexit_cb(qemu_plugin_id_t id, qemu_plugin_udata_cb_t cb, void *userdata);
extern void qemu_plugin_outs(const char *string);

__attribute__((visibility("default"))) int qemu_plugin_version = 1;

static uint64_t insns;
static char out_path[4096];

static void on_tb_trans(qemu_plugin_id_t id, struct qemu_plugin_tb *tb) {
    (void)id;
    qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &insns, qemu_plugin_tb_n_insns(tb));
}

static void on_plugin_exit(qemu_plugin_id_t id, void *p) {
    (void)id;
    (void)p;
    char line[64];
    snprintf(line, sizeof line, "insns: %llu\n", (unsigned long long)insns);
    if (out_path[0]) {
        FILE *f = fopen(out_path, "w");
        if (f) {
            fputs(line, f);
            fclose(f);
            return;
        }
    }
    qemu_plugin_outs(line);
}

__attribute__((visibility("default"))) int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info,
                                                               int argc, char **argv) {
    (void)info;
    for (int i = 0; i < argc; i++) {
        if (strncmp(argv[i], "out=", 4) == 0) {
            snprintf(out_path, sizeof out_path, "%s", argv[i] + 4);
        }
    }
    qemu_plugin_register_vcpu_tb_trans_cb(id, on_tb_trans);
    qemu_plugin_register_atexit_cb(id, on_plugin_exit, NULL);
    return 0;
}
