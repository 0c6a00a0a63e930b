/*
 * A qemu TCG plugin that counts guest instructions, deterministically.
 *
 * Every translated block gets an inline "add n_insns" to one counter when it
 * executes, so the count does not depend on timing. At exit the total is
 * printed as "insns: N" (to qemu's log, i.e. stderr), or written to the file
 * named by the plugin argument out=PATH.
 *
 * With the argument by_function=1 it also attributes every instruction to the
 * symbol of the guest's main executable that holds it (qemu's own lookup in
 * the ELF symbol table it loaded; code of shared libraries or of a stripped
 * binary counts as "?"), and writes one "count<TAB>symbol" line per symbol
 * after the total. Each translated block is cut into runs of instructions of
 * one symbol; each run's first instruction adds the run's length to that
 * symbol's counter, inline, so the attribution is as deterministic as the
 * total.
 *
 * Build: gcc -O2 -shared -fPIC -o libinsn_count.so insn_count.c
 * Use:   qemu-aarch64 -plugin ./libinsn_count.so,out=count.txt ./program
 *        qemu-aarch64 -plugin ./libinsn_count.so,out=count.txt,by_function=1 ./program
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
struct qemu_plugin_insn;
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
extern struct qemu_plugin_insn *qemu_plugin_tb_get_insn(const struct qemu_plugin_tb *tb, size_t idx);
extern const char *qemu_plugin_insn_symbol(const struct qemu_plugin_insn *insn);
extern void qemu_plugin_register_vcpu_insn_exec_inline(struct qemu_plugin_insn *insn, enum qemu_plugin_op op,
                                                       void *ptr, uint64_t imm);
extern void qemu_plugin_register_atexit_cb(qemu_plugin_id_t id, qemu_plugin_udata_cb_t cb, void *userdata);
extern void qemu_plugin_outs(const char *string);

__attribute__((visibility("default"))) int qemu_plugin_version = 1;

static uint64_t insns;
static char out_path[4096];
static int by_function;

/* One counter per symbol name: an open-addressed table keyed by the name's
 * pointer (qemu returns the same string for the same symbol). A full table
 * sends the rest to the last slot, "(table full)". */
#define SLOTS 65536
struct slot {
    const char *name;
    uint64_t count;
};
static struct slot slots[SLOTS];
static struct slot overflow = {"(table full)", 0};

static struct slot *slot_of(const char *name) {
    if (!name) {
        name = "?";
    }
    uint64_t h = (uint64_t)(uintptr_t)name * 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < SLOTS; i++) {
        struct slot *s = &slots[((h >> 48) + i) & (SLOTS - 1)];
        if (s->name == name) {
            return s;
        }
        if (!s->name) {
            s->name = name;
            return s;
        }
    }
    return &overflow;
}

static void on_tb_trans(qemu_plugin_id_t id, struct qemu_plugin_tb *tb) {
    (void)id;
    size_t n = qemu_plugin_tb_n_insns(tb);
    qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &insns, n);
    if (!by_function) {
        return;
    }
    /* Runs of one symbol: the first instruction of each adds the run's length. */
    size_t start = 0;
    const char *name = n ? qemu_plugin_insn_symbol(qemu_plugin_tb_get_insn(tb, 0)) : NULL;
    for (size_t i = 1; i <= n; i++) {
        const char *next = i < n ? qemu_plugin_insn_symbol(qemu_plugin_tb_get_insn(tb, i)) : NULL;
        if (i == n || next != name) {
            qemu_plugin_register_vcpu_insn_exec_inline(qemu_plugin_tb_get_insn(tb, start), QEMU_PLUGIN_INLINE_ADD_U64,
                                                       &slot_of(name)->count, i - start);
            start = i;
            name = next;
        }
    }
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
            for (size_t i = 0; by_function && i <= SLOTS; i++) {
                const struct slot *s = i < SLOTS ? &slots[i] : &overflow;
                if (s->name && s->count) {
                    fprintf(f, "%llu\t%s\n", (unsigned long long)s->count, s->name);
                }
            }
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
        } else if (strcmp(argv[i], "by_function=1") == 0) {
            by_function = 1;
        }
    }
    qemu_plugin_register_vcpu_tb_trans_cb(id, on_tb_trans);
    qemu_plugin_register_atexit_cb(id, on_plugin_exit, NULL);
    return 0;
}
