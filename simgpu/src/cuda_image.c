/*
 * Reading module images for their entry functions. A cubin is an ELF file whose kernels are
 * function symbols marked as CUDA entries in st_other; PTX text declares them with `.entry`; a
 * fatbin is a container of cubins and PTX for several architectures. Every read is bounded by
 * the image's own headers (and by its size where the caller knows it).
 */
#include "cuda_image.h"

#include <elf.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define EM_CUDA_MACHINE 190       /* e_machine of a cubin */
#define STO_CUDA_ENTRY 0x10       /* st_other bit of a kernel's symbol */
#define CUDA_ELF_ABI_V7 7         /* e_ident[EI_ABIVERSION] whose e_flags layout is known here */
#define FATBIN_HEADER_SIZE 16
#define FATBIN_ENTRY_MIN 64
#define FATBIN_KIND_PTX 1
#define FATBIN_KIND_ELF 2
#define FATBIN_COMPRESSED 0x2000

/* Compare a prefix byte by byte, so a short NUL-terminated image is never read past its end. */
static bool starts_with(const unsigned char *p, const unsigned char *magic, size_t n, size_t size)
{
    if (size < n)
        return false;
    for (size_t i = 0; i < n; i++) {
        if (p[i] != magic[i])
            return false;
    }
    return true;
}

/* Append an entry function, its parameters unknown until they are read. */
static CUresult add_entry(struct sim_image *img, const char *name, size_t len)
{
    struct sim_entry *grown = realloc(img->entries, (img->count + 1) * sizeof *grown);
    if (grown == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    img->entries = grown;
    char *copy = strndup(name, len);
    if (copy == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    img->entries[img->count++] = (struct sim_entry){.name = copy};
    return CUDA_SUCCESS;
}

/* Record parameter `ordinal` of an entry (cubins list them in any order). */
static CUresult add_param(struct sim_entry *e, size_t ordinal, size_t offset, size_t size)
{
    if (ordinal >= e->param_count) {
        struct sim_param *grown = realloc(e->params, (ordinal + 1) * sizeof *grown);
        if (grown == NULL)
            return CUDA_ERROR_OUT_OF_MEMORY;
        memset(grown + e->param_count, 0, (ordinal + 1 - e->param_count) * sizeof *grown);
        e->params = grown;
        e->param_count = ordinal + 1;
    }
    e->params[ordinal] = (struct sim_param){offset, size};
    return CUDA_SUCCESS;
}

/* ---- PTX ---- */

/* Skip blanks and comments; NULL at the end of the text. */
static const char *ptx_skip(const char *p)
{
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
            p++;
        if (p[0] == '/' && p[1] == '/') {
            p = strchr(p, '\n');
            if (p == NULL)
                return NULL;
        } else if (p[0] == '/' && p[1] == '*') {
            p = strstr(p + 2, "*/");
            if (p == NULL)
                return NULL;
            p += 2;
        } else {
            return *p == '\0' ? NULL : p;
        }
    }
}

static bool ptx_ident_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '$' || c == '%' || c == '.';
}

/* The token at p and its length. */
static size_t ptx_token(const char *p)
{
    size_t n = 0;
    while (ptx_ident_char(p[n]))
        n++;
    return n;
}

/* The size in bytes of a PTX fundamental type token (.u32 is 4, .pred 1), or 0. */
static size_t ptx_type_size(const char *tok, size_t n)
{
    if (n == 5 && strncmp(tok, ".pred", 5) == 0)
        return 1;
    if (n < 3 || n > 5 || tok[0] != '.' || strchr("usbf", tok[1]) == NULL)
        return 0;
    size_t bits = 0;
    for (size_t i = 2; i < n; i++) {
        if (tok[i] < '0' || tok[i] > '9')
            return 0;
        bits = bits * 10 + (size_t)(tok[i] - '0');
    }
    return bits % 8 == 0 ? bits / 8 : 0;
}

/* One `.param` declaration at p (just past the `.param`): its alignment and size; the text
 * after it in *end. False if it is not one the simulator understands. */
static bool ptx_param(const char *p, size_t *align, size_t *size, const char **end)
{
    size_t type = 0, count = 1;
    *align = 0;
    while ((p = ptx_skip(p)) != NULL && *p != ',' && *p != ')') {
        size_t n = ptx_token(p);
        if (n == 6 && strncmp(p, ".align", 6) == 0) {
            p = ptx_skip(p + n);
            if (p == NULL)
                return false;
            *align = strtoul(p, (char **)&p, 10);
        } else if (n > 0 && p[0] == '.') {
            if (ptx_type_size(p, n) != 0)
                type = ptx_type_size(p, n);
            p += n; /* a type, or a qualifier such as .ptr .global */
        } else if (n > 0) {
            p += n; /* the parameter's name */
        } else if (*p == '[') {
            count = strtoul(p + 1, (char **)&p, 10);
            p = strchr(p, ']');
            if (p == NULL)
                return false;
            p++;
        } else {
            return false;
        }
    }
    if (p == NULL || type == 0)
        return false;
    if (*align == 0)
        *align = type;
    *size = type * count;
    *end = p;
    return true;
}

/* The parameter list of an entry, at p (just past its name): offsets in the order declared,
 * each aligned as declared or to its type's size. Leaves the entry's parameters unknown if the
 * list is not one the simulator understands. */
static CUresult ptx_params(const char *p, struct sim_entry *e)
{
    p = ptx_skip(p);
    if (p == NULL || *p != '(') { /* no parameter list: no parameters */
        e->params_known = true;
        return CUDA_SUCCESS;
    }
    size_t offset = 0;
    for (p++;;) {
        p = ptx_skip(p);
        if (p == NULL)
            return CUDA_SUCCESS;
        if (*p == ')')
            break;
        size_t n = ptx_token(p), align = 0, size = 0;
        if (n != 6 || strncmp(p, ".param", 6) != 0 || !ptx_param(p + n, &align, &size, &p))
            return CUDA_SUCCESS;
        offset = (offset + align - 1) / align * align;
        CUresult rc = add_param(e, e->param_count, offset, size);
        if (rc != CUDA_SUCCESS)
            return rc;
        offset += size;
        if (*p == ',')
            p++;
    }
    e->params_known = true;
    return CUDA_SUCCESS;
}

/* PTX is text whose first directive is .version; every `.entry NAME` is a kernel. */
static CUresult read_ptx(const char *text, struct sim_image *img, bool *is_ptx)
{
    const char *p = ptx_skip(text);
    *is_ptx = p != NULL && strncmp(p, ".version", 8) == 0 && !ptx_ident_char(p[8]);
    if (!*is_ptx)
        return CUDA_SUCCESS;
    img->extent = strlen(text) + 1;
    while ((p = ptx_skip(p)) != NULL) {
        size_t n = ptx_token(p);
        if (n == 0) {
            p++;
            continue;
        }
        if (n == 6 && strncmp(p, ".entry", 6) == 0) {
            const char *name = ptx_skip(p + n);
            size_t len = name != NULL ? ptx_token(name) : 0;
            if (len == 0)
                return CUDA_ERROR_INVALID_PTX;
            CUresult rc = add_entry(img, name, len);
            if (rc == CUDA_SUCCESS)
                rc = ptx_params(name + len, &img->entries[img->count - 1]);
            if (rc != CUDA_SUCCESS)
                return rc;
            p = name + len;
        } else {
            p += n;
        }
    }
    return CUDA_SUCCESS;
}

/* ---- cubin (ELF) ---- */

static bool within(uint64_t off, uint64_t len, size_t size)
{
    return off <= size && len <= size - off;
}

/* The bytes the ELF file spans by its headers: section and program header tables and every
 * section with contents. */
static CUresult elf_extent(const unsigned char *base, size_t size, size_t *out)
{
    Elf64_Ehdr eh;
    if (size < sizeof eh)
        return CUDA_ERROR_INVALID_IMAGE;
    memcpy(&eh, base, sizeof eh);
    if (eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_ident[EI_DATA] != ELFDATA2LSB ||
        eh.e_machine != EM_CUDA_MACHINE || eh.e_shentsize != sizeof(Elf64_Shdr) ||
        eh.e_shnum == 0 || eh.e_shoff > SIZE_MAX / 2 || eh.e_phoff > SIZE_MAX / 2)
        return CUDA_ERROR_INVALID_IMAGE;
    uint64_t end = eh.e_shoff + (uint64_t)eh.e_shnum * sizeof(Elf64_Shdr);
    uint64_t ph_end = eh.e_phoff + (uint64_t)eh.e_phnum * eh.e_phentsize;
    if (ph_end > end)
        end = ph_end;
    if (end > size)
        return CUDA_ERROR_INVALID_IMAGE;
    for (unsigned i = 0; i < eh.e_shnum; i++) {
        Elf64_Shdr sh;
        memcpy(&sh, base + eh.e_shoff + i * sizeof sh, sizeof sh);
        if (sh.sh_type == SHT_NOBITS || sh.sh_type == SHT_NULL)
            continue;
        if (sh.sh_offset > SIZE_MAX / 2 || sh.sh_size > SIZE_MAX / 2)
            return CUDA_ERROR_INVALID_IMAGE;
        if (sh.sh_offset + sh.sh_size > end)
            end = sh.sh_offset + sh.sh_size;
    }
    if (end > size)
        return CUDA_ERROR_INVALID_IMAGE;
    *out = (size_t)end;
    return CUDA_SUCCESS;
}

/* A cubin describes each kernel in a section .nv.info.<kernel> of records: a format byte, an
 * attribute byte, then a 16-bit value (format 3) or a 16-bit size and that many bytes (format
 * 4). KPARAM_INFO records (attribute 0x17) give a parameter's ordinal, offset and size. */
#define NVINFO_HVAL 3
#define NVINFO_SVAL 4
#define NVINFO_KPARAM_INFO 0x17
#define KPARAM_SIZE_SHIFT 18

static CUresult elf_params(const unsigned char *data, size_t len, struct sim_entry *e)
{
    for (size_t i = 0; i + 4 <= len;) {
        unsigned char format = data[i], attr = data[i + 1];
        uint16_t value = (uint16_t)(data[i + 2] | data[i + 3] << 8);
        if (format == NVINFO_HVAL) {
            i += 4;
            continue;
        }
        if (format != NVINFO_SVAL || value > len - i - 4)
            return CUDA_SUCCESS; /* a record the simulator cannot size: parameters unknown */
        if (attr == NVINFO_KPARAM_INFO && value >= 12) {
            const unsigned char *r = data + i + 4;
            uint16_t ordinal = (uint16_t)(r[4] | r[5] << 8), offset = (uint16_t)(r[6] | r[7] << 8);
            uint32_t flags;
            memcpy(&flags, r + 8, sizeof flags);
            CUresult rc = add_param(e, ordinal, offset, flags >> KPARAM_SIZE_SHIFT);
            if (rc != CUDA_SUCCESS)
                return rc;
        }
        i += 4 + value;
    }
    e->params_known = true;
    return CUDA_SUCCESS;
}

/* Each entry's parameters, from its .nv.info section where there is one. */
static CUresult elf_entry_params(const unsigned char *base, size_t size, const Elf64_Ehdr *eh,
                                 struct sim_image *img)
{
    Elf64_Shdr names;
    if (eh->e_shstrndx >= eh->e_shnum)
        return CUDA_ERROR_INVALID_IMAGE;
    memcpy(&names, base + eh->e_shoff + eh->e_shstrndx * sizeof names, sizeof names);
    if (!within(names.sh_offset, names.sh_size, size) || names.sh_size == 0 ||
        base[names.sh_offset + names.sh_size - 1] != '\0')
        return CUDA_ERROR_INVALID_IMAGE;
    static const char prefix[] = ".nv.info.";
    for (unsigned i = 0; i < eh->e_shnum; i++) {
        Elf64_Shdr sh;
        memcpy(&sh, base + eh->e_shoff + i * sizeof sh, sizeof sh);
        if (sh.sh_name >= names.sh_size)
            return CUDA_ERROR_INVALID_IMAGE;
        const char *name = (const char *)base + names.sh_offset + sh.sh_name;
        if (strncmp(name, prefix, sizeof prefix - 1) != 0)
            continue;
        struct sim_entry *e = (struct sim_entry *)sim_image_entry(img, name + sizeof prefix - 1);
        if (e == NULL)
            continue;
        if (!within(sh.sh_offset, sh.sh_size, size))
            return CUDA_ERROR_INVALID_IMAGE;
        CUresult rc = elf_params(base + sh.sh_offset, (size_t)sh.sh_size, e);
        if (rc != CUDA_SUCCESS)
            return rc;
    }
    return CUDA_SUCCESS;
}

/* Whether a cubin of architecture `sm` runs on a device of capability `cc`: same major, minor
 * not above the device's. */
static bool cubin_fits(int sm, int cc)
{
    return cc < 0 || (sm / 10 == cc / 10 && sm % 10 <= cc % 10);
}

static CUresult read_elf(const unsigned char *base, size_t size, int cc, struct sim_image *img)
{
    CUresult rc = elf_extent(base, size, &img->extent);
    if (rc != CUDA_SUCCESS)
        return rc;
    size = img->extent;
    Elf64_Ehdr eh;
    memcpy(&eh, base, sizeof eh);
    /* In CUDA ELF ABI version 7 the low byte of e_flags is the SM the code was built for;
     * other versions lay the flags out differently and are not checked. */
    if (eh.e_ident[EI_ABIVERSION] == CUDA_ELF_ABI_V7 && !cubin_fits((int)(eh.e_flags & 0xff), cc))
        return CUDA_ERROR_NO_BINARY_FOR_GPU;
    for (unsigned i = 0; i < eh.e_shnum; i++) {
        Elf64_Shdr symtab, strtab;
        memcpy(&symtab, base + eh.e_shoff + i * sizeof symtab, sizeof symtab);
        if (symtab.sh_type != SHT_SYMTAB)
            continue;
        if (symtab.sh_link >= eh.e_shnum || symtab.sh_entsize != sizeof(Elf64_Sym))
            return CUDA_ERROR_INVALID_IMAGE;
        memcpy(&strtab, base + eh.e_shoff + symtab.sh_link * sizeof strtab, sizeof strtab);
        if (!within(symtab.sh_offset, symtab.sh_size, size) ||
            !within(strtab.sh_offset, strtab.sh_size, size) || strtab.sh_size == 0 ||
            base[strtab.sh_offset + strtab.sh_size - 1] != '\0')
            return CUDA_ERROR_INVALID_IMAGE;
        for (uint64_t j = 0; j < symtab.sh_size / sizeof(Elf64_Sym); j++) {
            Elf64_Sym sym;
            memcpy(&sym, base + symtab.sh_offset + j * sizeof sym, sizeof sym);
            if (ELF64_ST_TYPE(sym.st_info) != STT_FUNC || (sym.st_other & STO_CUDA_ENTRY) == 0)
                continue;
            if (sym.st_name >= strtab.sh_size)
                return CUDA_ERROR_INVALID_IMAGE;
            const char *name = (const char *)base + strtab.sh_offset + sym.st_name;
            rc = add_entry(img, name, strlen(name));
            if (rc != CUDA_SUCCESS)
                return rc;
        }
    }
    return elf_entry_params(base, size, &eh, img);
}

/* ---- fatbin ---- */

struct fatbin_entry {
    uint16_t kind;
    uint32_t header_size;
    uint64_t payload_size;
    uint32_t arch;
    uint64_t flags;
    const unsigned char *payload;
};

static uint32_t le32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static uint64_t le64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Whether an entry runs on a device of capability cc: a cubin needs the same major and a
 * minor not above the device's; PTX is compiled for any device at least its architecture. */
static bool entry_fits(const struct fatbin_entry *e, int cc)
{
    if (e->kind == FATBIN_KIND_ELF)
        return cubin_fits((int)e->arch, cc);
    return cc < 0 || (int)e->arch <= cc;
}

static CUresult read_any(const unsigned char *base, size_t size, int cc, struct sim_image *img);

static CUresult read_fatbin(const unsigned char *base, size_t size, int cc, struct sim_image *img)
{
    if (size < FATBIN_HEADER_SIZE)
        return CUDA_ERROR_INVALID_IMAGE;
    uint64_t body = le64(base + 8);
    if (base[4] != 1 || base[5] != 0 || base[6] != FATBIN_HEADER_SIZE || base[7] != 0 ||
        body > size - FATBIN_HEADER_SIZE)
        return CUDA_ERROR_INVALID_IMAGE;
    img->extent = FATBIN_HEADER_SIZE + body;
    struct fatbin_entry best = {0};
    for (uint64_t off = FATBIN_HEADER_SIZE; off < img->extent;) {
        const unsigned char *p = base + off;
        if (img->extent - off < FATBIN_ENTRY_MIN)
            return CUDA_ERROR_INVALID_IMAGE;
        struct fatbin_entry e = {.kind = (uint16_t)(p[0] | p[1] << 8),
                                 .header_size = le32(p + 4),
                                 .payload_size = le64(p + 8),
                                 .arch = le32(p + 28),
                                 .flags = le64(p + 40)};
        if (e.header_size < FATBIN_ENTRY_MIN ||
            !within(e.header_size, e.payload_size, img->extent - off))
            return CUDA_ERROR_INVALID_IMAGE;
        e.payload = p + e.header_size;
        off += e.header_size + e.payload_size;
        if ((e.kind != FATBIN_KIND_ELF && e.kind != FATBIN_KIND_PTX) || !entry_fits(&e, cc))
            continue;
        /* A cubin beats PTX; among equals, the newest architecture. */
        if (best.kind == 0 || (e.kind == FATBIN_KIND_ELF && best.kind == FATBIN_KIND_PTX) ||
            (e.kind == best.kind && e.arch > best.arch))
            best = e;
    }
    if (best.kind == 0)
        return CUDA_ERROR_NO_BINARY_FOR_GPU;
    size_t extent = img->extent;
    if (best.flags & FATBIN_COMPRESSED) {
        img->opaque = true; /* its names are not readable without decompressing */
        return CUDA_SUCCESS;
    }
    struct sim_image inner = {0};
    CUresult rc = read_any(best.payload, (size_t)best.payload_size, cc, &inner);
    if (rc == CUDA_SUCCESS && inner.opaque)
        rc = CUDA_ERROR_INVALID_IMAGE;
    if (rc != CUDA_SUCCESS) {
        sim_image_free(&inner);
        return rc;
    }
    *img = inner;
    img->extent = extent;
    return CUDA_SUCCESS;
}

static CUresult read_any(const unsigned char *base, size_t size, int cc, struct sim_image *img)
{
    static const unsigned char elf[] = {ELFMAG0, ELFMAG1, ELFMAG2, ELFMAG3};
    static const unsigned char fatbin[] = {0x50, 0xED, 0x55, 0xBA};  /* 0xBA55ED50, LE */
    /* nvcc's host-side wrapper, {0x466243B1, version, fatbin pointer, ...}: */
    static const unsigned char wrapper[] = {0xB1, 0x43, 0x62, 0x46};
    if (starts_with(base, elf, sizeof elf, size))
        return read_elf(base, size, cc, img);
    if (starts_with(base, fatbin, sizeof fatbin, size))
        return read_fatbin(base, size, cc, img);
    if (starts_with(base, wrapper, sizeof wrapper, size) && size == SIM_IMAGE_SIZE_UNKNOWN) {
        const unsigned char *data = NULL;
        memcpy(&data, base + 8, sizeof data);
        if (data == NULL || !starts_with(data, fatbin, sizeof fatbin, size))
            return CUDA_ERROR_INVALID_IMAGE; /* it wraps a fatbin, nothing else */
        return read_fatbin(data, size, cc, img);
    }
    /* Text: an image from memory is NUL-terminated by the API's contract, a file by its
     * reader; a fatbin's payload must be. */
    if (size != SIM_IMAGE_SIZE_UNKNOWN && memchr(base, '\0', size) == NULL)
        return CUDA_ERROR_INVALID_IMAGE;
    bool is_ptx = false;
    CUresult rc = read_ptx((const char *)base, img, &is_ptx);
    img->opaque = !is_ptx;
    return rc;
}

CUresult sim_image_read(const void *image, size_t size, int cc, struct sim_image *out)
{
    memset(out, 0, sizeof *out);
    CUresult rc = read_any(image, size, cc, out);
    if (rc != CUDA_SUCCESS)
        sim_image_free(out);
    return rc;
}

bool sim_image_defines(const struct sim_image *image, const char *name)
{
    if (image->opaque)
        return true;
    return sim_image_entry(image, name) != NULL;
}

const struct sim_entry *sim_image_entry(const struct sim_image *image, const char *name)
{
    for (size_t i = 0; i < image->count; i++) {
        if (strcmp(image->entries[i].name, name) == 0)
            return &image->entries[i];
    }
    return NULL;
}

CUresult sim_entry_param(const struct sim_entry *entry, size_t index, size_t *offset,
                         size_t *size)
{
    if (offset == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (entry == NULL || !entry->params_known)
        return CUDA_ERROR_NOT_SUPPORTED;
    if (index >= entry->param_count)
        return CUDA_ERROR_INVALID_VALUE;
    *offset = entry->params[index].offset;
    if (size != NULL)
        *size = entry->params[index].size;
    return CUDA_SUCCESS;
}

void sim_image_free(struct sim_image *image)
{
    for (size_t i = 0; i < image->count; i++) {
        free(image->entries[i].name);
        free(image->entries[i].params);
    }
    free(image->entries);
    memset(image, 0, sizeof *image);
}
