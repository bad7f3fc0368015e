/*
 * Simulator only: how the simulated driver reads malformed module images, one case per way the
 * reader (simgpu/src/cuda_image.c) can refuse one, plus its documented leniencies. NVIDIA does
 * not document which error a real driver gives for each corruption, so these are the
 * simulator's own rules (docs/simgpu.md). Usage: image_formats IMAGE_DIR (tests/simgpu/images).
 */
#include <elf.h>
#include <stdbool.h>
#include <unistd.h>

#include "simgpu_test.h"

static void *lib;
static unsigned char *cubin;
static size_t cubin_size;

/* Load `size` bytes through a file (so the reader knows the size) and return the result. */
static CUresult load_file(const void *data, size_t size, CUmodule *m)
{
    LOAD(lib, cuModuleLoad);
    char path[] = "/tmp/image_formats_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0 || write(fd, data, size) != (ssize_t)size)
        exit(2);
    close(fd);
    CUresult rc = p_cuModuleLoad(m, path);
    unlink(path);
    return rc;
}

static void expect_file(const void *data, size_t size, CUresult want, const char *what)
{
    LOAD(lib, cuModuleUnload);
    CUmodule m = NULL;
    CUresult rc = load_file(data, size, &m);
    if (rc != want)
        fprintf(stderr, "case: %s\n", what);
    EXPECT_EQ(rc, want);
    if (rc == CUDA_SUCCESS)
        p_cuModuleUnload(m);
}

/* A copy of the cubin with `edit` applied. */
static unsigned char *copy(void)
{
    unsigned char *c = malloc(cubin_size);
    if (c == NULL)
        exit(2);
    memcpy(c, cubin, cubin_size);
    return c;
}

static Elf64_Shdr *section(unsigned char *c, Elf64_Word type)
{
    Elf64_Ehdr *eh = (Elf64_Ehdr *)c;
    for (unsigned i = 0; i < eh->e_shnum; i++) {
        Elf64_Shdr *sh = (Elf64_Shdr *)(c + eh->e_shoff + i * sizeof *sh);
        if (sh->sh_type == type)
            return sh;
    }
    fprintf(stderr, "the cubin has no section of type %u\n", type);
    exit(2);
}

static Elf64_Sym *entry_symbol(unsigned char *c)
{
    Elf64_Shdr *symtab = section(c, SHT_SYMTAB);
    for (uint64_t j = 0; j < symtab->sh_size / sizeof(Elf64_Sym); j++) {
        Elf64_Sym *sym = (Elf64_Sym *)(c + symtab->sh_offset + j * sizeof *sym);
        if (ELF64_ST_TYPE(sym->st_info) == STT_FUNC && (sym->st_other & 0x10))
            return sym;
    }
    fprintf(stderr, "the cubin has no kernel\n");
    exit(2);
}

static void malformed_cubins(void)
{
    unsigned char *c;
    Elf64_Ehdr *eh;
    expect_file(cubin, cubin_size, CUDA_SUCCESS, "the cubin as built");

    c = copy();
    eh = (Elf64_Ehdr *)c;
    eh->e_machine = EM_X86_64;
    expect_file(c, cubin_size, CUDA_ERROR_INVALID_IMAGE, "an ELF file for another machine");
    free(c);

    c = copy();
    c[EI_CLASS] = ELFCLASS32;
    expect_file(c, cubin_size, CUDA_ERROR_INVALID_IMAGE, "a 32-bit ELF file");
    free(c);

    c = copy();
    eh = (Elf64_Ehdr *)c;
    eh->e_shentsize = 0;
    expect_file(c, cubin_size, CUDA_ERROR_INVALID_IMAGE, "a wrong section header size");
    free(c);

    c = copy();
    eh = (Elf64_Ehdr *)c;
    eh->e_shoff = (Elf64_Off)1 << 62;
    expect_file(c, cubin_size, CUDA_ERROR_INVALID_IMAGE, "section headers beyond any file");
    free(c);

    c = copy();
    section(c, SHT_SYMTAB)->sh_offset = cubin_size;
    expect_file(c, cubin_size, CUDA_ERROR_INVALID_IMAGE, "a symbol table past the end");
    free(c);

    c = copy();
    section(c, SHT_SYMTAB)->sh_link = 0xffff;
    expect_file(c, cubin_size, CUDA_ERROR_INVALID_IMAGE, "a symbol table without strings");
    free(c);

    c = copy();
    section(c, SHT_SYMTAB)->sh_entsize = 1;
    expect_file(c, cubin_size, CUDA_ERROR_INVALID_IMAGE, "a wrong symbol size");
    free(c);

    c = copy();
    {
        Elf64_Shdr *symtab = section(c, SHT_SYMTAB);
        eh = (Elf64_Ehdr *)c;
        Elf64_Shdr *strtab = (Elf64_Shdr *)(c + eh->e_shoff + symtab->sh_link * sizeof *strtab);
        c[strtab->sh_offset + strtab->sh_size - 1] = 'x';
    }
    expect_file(c, cubin_size, CUDA_ERROR_INVALID_IMAGE, "an unterminated string table");
    free(c);

    c = copy();
    entry_symbol(c)->st_name = 0x7fffffff;
    expect_file(c, cubin_size, CUDA_ERROR_INVALID_IMAGE, "a kernel name outside the strings");
    free(c);

    expect_file(cubin, 32, CUDA_ERROR_INVALID_IMAGE, "an ELF header cut short");
}

/* A fatbin of one entry: header (magic, version 1, header size 16, body size), entry header
 * (kind, header size, payload size, arch, flags) and payload. */
static unsigned char *fatbin(unsigned short kind, const void *payload, size_t size, uint64_t flags,
                             size_t *total)
{
    size_t padded = (size + 7) & ~(size_t)7;
    *total = 16 + 64 + padded;
    unsigned char *fb = calloc(1, *total);
    if (fb == NULL)
        exit(2);
    uint32_t magic = 0xBA55ED50u, hsize = 64, arch = 90;
    uint16_t version = 1, header = 16;
    uint64_t body = 64 + padded, psize = padded;
    memcpy(fb, &magic, 4);
    memcpy(fb + 4, &version, 2);
    memcpy(fb + 6, &header, 2);
    memcpy(fb + 8, &body, 8);
    memcpy(fb + 16, &kind, 2);
    memcpy(fb + 20, &hsize, 4);
    memcpy(fb + 24, &psize, 8);
    memcpy(fb + 16 + 28, &arch, 4);
    memcpy(fb + 16 + 40, &flags, 8);
    memcpy(fb + 80, payload, size);
    return fb;
}

static Elf64_Shdr *named_section(unsigned char *c, const char *name)
{
    Elf64_Ehdr *eh = (Elf64_Ehdr *)c;
    Elf64_Shdr *names = (Elf64_Shdr *)(c + eh->e_shoff + eh->e_shstrndx * sizeof *names);
    for (unsigned i = 0; i < eh->e_shnum; i++) {
        Elf64_Shdr *sh = (Elf64_Shdr *)(c + eh->e_shoff + i * sizeof *sh);
        if (strcmp((char *)c + names->sh_offset + sh->sh_name, name) == 0)
            return sh;
    }
    fprintf(stderr, "the cubin has no section %s\n", name);
    exit(2);
}

/* The first parameter of the cubin's kernel, from a cubin loaded through a file. */
static CUresult first_param(const unsigned char *c, size_t *offset)
{
    LOAD(lib, cuModuleGetFunction);
    LOAD(lib, cuModuleUnload);
    LOAD(lib, cuFuncGetParamInfo);
    CUmodule m = NULL;
    CUfunction f = NULL;
    CUresult rc = load_file(c, cubin_size, &m);
    if (rc == CUDA_SUCCESS) {
        EXPECT_EQ(p_cuModuleGetFunction(&f, m, "simgpu_sleep_ns"), CUDA_SUCCESS);
        rc = p_cuFuncGetParamInfo(f, 0, offset, NULL);
        p_cuModuleUnload(m);
    }
    return rc;
}

static void parameter_sections(void)
{
    const char *info = ".nv.info.simgpu_sleep_ns";
    size_t offset = 99;
    unsigned char *c;
    Elf64_Ehdr *eh;
    EXPECT_EQ(first_param(cubin, &offset), CUDA_SUCCESS);
    EXPECT_EQ(offset, 0);

    /* Without the kernel's .nv.info section the parameters are unknown, not wrong. */
    c = copy();
    {
        eh = (Elf64_Ehdr *)c;
        Elf64_Shdr *names = (Elf64_Shdr *)(c + eh->e_shoff + eh->e_shstrndx * sizeof *names);
        c[names->sh_offset + named_section(c, info)->sh_name + 4] = 'X'; /* .nv.Xnfo. */
    }
    EXPECT_EQ(first_param(c, &offset), CUDA_ERROR_NOT_SUPPORTED);
    free(c);

    /* A record whose format the simulator cannot size leaves them unknown too. */
    c = copy();
    c[named_section(c, info)->sh_offset] = 7;
    EXPECT_EQ(first_param(c, &offset), CUDA_ERROR_NOT_SUPPORTED);
    free(c);

    c = copy();
    eh = (Elf64_Ehdr *)c;
    eh->e_shstrndx = eh->e_shnum;
    EXPECT_EQ(first_param(c, &offset), CUDA_ERROR_INVALID_IMAGE);
    free(c);

    c = copy();
    eh = (Elf64_Ehdr *)c;
    {
        Elf64_Shdr *names = (Elf64_Shdr *)(c + eh->e_shoff + eh->e_shstrndx * sizeof *names);
        c[names->sh_offset + names->sh_size - 1] = 'x';
    }
    EXPECT_EQ(first_param(c, &offset), CUDA_ERROR_INVALID_IMAGE);
    free(c);

    c = copy();
    named_section(c, info)->sh_name = 0x7fffffff;
    EXPECT_EQ(first_param(c, &offset), CUDA_ERROR_INVALID_IMAGE);
    free(c);

    /* Sections without contents in the file (NOBITS) must still lie inside it to be read. */
    c = copy();
    {
        Elf64_Shdr *sh = named_section(c, info);
        sh->sh_type = SHT_NOBITS;
        sh->sh_offset = (Elf64_Off)1 << 40;
    }
    EXPECT_EQ(first_param(c, &offset), CUDA_ERROR_INVALID_IMAGE);
    free(c);

    c = copy();
    eh = (Elf64_Ehdr *)c;
    {
        Elf64_Shdr *names = (Elf64_Shdr *)(c + eh->e_shoff + eh->e_shstrndx * sizeof *names);
        names->sh_type = SHT_NOBITS;
        names->sh_offset = (Elf64_Off)1 << 40;
    }
    EXPECT_EQ(first_param(c, &offset), CUDA_ERROR_INVALID_IMAGE);
    free(c);
}

static void malformed_fatbins(void)
{
    LOAD(lib, cuModuleLoadData);
    LOAD(lib, cuModuleGetFunction);
    LOAD(lib, cuModuleUnload);
    size_t size = 0;
    unsigned char *fb = fatbin(2, cubin, cubin_size, 0x11, &size);
    expect_file(fb, size, CUDA_SUCCESS, "a well-formed fatbin");

    fb[4] = 2;
    expect_file(fb, size, CUDA_ERROR_INVALID_IMAGE, "a fatbin of another version");
    fb[4] = 1;
    expect_file(fb, size - 8, CUDA_ERROR_INVALID_IMAGE, "a fatbin cut short");
    expect_file(fb, 8, CUDA_ERROR_INVALID_IMAGE, "a fatbin header cut short");
    uint64_t short_body = 32;
    memcpy(fb + 8, &short_body, 8);
    expect_file(fb, 16 + 32, CUDA_ERROR_INVALID_IMAGE, "an entry header cut short");
    uint64_t body = size - 16;
    memcpy(fb + 8, &body, 8);
    uint32_t small = 8;
    memcpy(fb + 20, &small, 4);
    expect_file(fb, size, CUDA_ERROR_INVALID_IMAGE, "an entry header too small");
    free(fb);

    fb = fatbin(2, cubin, cubin_size, 0x11, &size);
    uint64_t huge = (uint64_t)1 << 40;
    memcpy(fb + 24, &huge, 8);
    expect_file(fb, size, CUDA_ERROR_INVALID_IMAGE, "an entry larger than the fatbin");
    free(fb);

    static const char text[] = "not PTX at all";
    fb = fatbin(1, text, sizeof text, 0x11, &size);
    expect_file(fb, size, CUDA_ERROR_INVALID_IMAGE, "a PTX entry that is not PTX");
    free(fb);

    static const char unterminated[8] = {'.', 'v', 'e', 'r', 's', 'i', 'o', 'n'};
    fb = fatbin(1, unterminated, sizeof unterminated, 0x11, &size);
    expect_file(fb, size, CUDA_ERROR_INVALID_IMAGE, "a PTX entry without its NUL");
    free(fb);

    /* Leniency: a compressed entry is not decompressed, so its module resolves any name. */
    CUmodule m = NULL;
    CUfunction f = NULL;
    fb = fatbin(2, cubin, cubin_size, 0x11 | 0x2000, &size);
    EXPECT_EQ(p_cuModuleLoadData(&m, fb), CUDA_SUCCESS);
    EXPECT_EQ(p_cuModuleGetFunction(&f, m, "any_name_at_all"), CUDA_SUCCESS);
    EXPECT_EQ(p_cuModuleUnload(m), CUDA_SUCCESS);

    /* nvcc's wrapper around a fatbin is followed; one pointing nowhere is refused. */
    struct {
        uint32_t magic, version;
        const void *data, *unused;
    } wrapper = {0x466243B1u, 1, fb, NULL};
    EXPECT_EQ(p_cuModuleLoadData(&m, &wrapper), CUDA_SUCCESS);
    EXPECT_EQ(p_cuModuleUnload(m), CUDA_SUCCESS);
    wrapper.data = NULL;
    EXPECT_EQ(p_cuModuleLoadData(&m, &wrapper), CUDA_ERROR_INVALID_IMAGE);
    wrapper.data = &wrapper; /* it wraps a fatbin, not another wrapper */
    EXPECT_EQ(p_cuModuleLoadData(&m, &wrapper), CUDA_ERROR_INVALID_IMAGE);
    wrapper.data = cubin;
    EXPECT_EQ(p_cuModuleLoadData(&m, &wrapper), CUDA_ERROR_INVALID_IMAGE);
    free(fb);
}

static void texts(void)
{
    LOAD(lib, cuFuncGetParamInfo);
    LOAD(lib, cuModuleLoadData);
    LOAD(lib, cuModuleGetFunction);
    LOAD(lib, cuModuleUnload);
    CUmodule m = NULL;
    CUfunction f = NULL;
    /* A directive in a comment is not one; an .entry without a name is invalid PTX. */
    static const char commented[] = "// leading comment\n/* .entry hidden( */\n.version 8.0\n"
                                    ".target sm_90\n.visible .entry shown()\n{\n ret;\n}\n";
    EXPECT_EQ(p_cuModuleLoadData(&m, commented), CUDA_SUCCESS);
    EXPECT_EQ(p_cuModuleGetFunction(&f, m, "shown"), CUDA_SUCCESS);
    EXPECT_EQ(p_cuModuleGetFunction(&f, m, "hidden"), CUDA_ERROR_NOT_FOUND);
    EXPECT_EQ(p_cuModuleUnload(m), CUDA_SUCCESS);
    EXPECT_EQ(p_cuModuleLoadData(&m, ".version 8.0\n.entry"), CUDA_ERROR_INVALID_PTX);
    /* Leniency: text that is no PTX (nor any other format) loads and resolves any name; its
     * parameters are unknown. */
    size_t offset = 0;
    EXPECT_EQ(p_cuModuleLoadData(&m, "image"), CUDA_SUCCESS);
    EXPECT_EQ(p_cuModuleGetFunction(&f, m, "simgpu_sleep_ns"), CUDA_SUCCESS);
    EXPECT_EQ(p_cuFuncGetParamInfo(f, 0, &offset, NULL), CUDA_ERROR_NOT_SUPPORTED);
    EXPECT_EQ(p_cuModuleUnload(m), CUDA_SUCCESS);
    /* Parameter lists the simulator does not understand leave the parameters unknown. */
    static const char *const unread[] = {
        ".version 8.0\n.entry k(.param .f16x2 a)\n{ ret; }\n", /* a vector type */
        ".version 8.0\n.entry k(.param .u32 a[4\n",             /* no ] */
        ".version 8.0\n.entry k(.param .u32 a,\n",              /* the list never ends */
        ".version 8.0\n.entry k(.reg .u32 a)\n{ ret; }\n",     /* not a .param */
        ".version 8.0\n.entry k(.param .u32 a ; )\n{ ret; }\n", /* a stray character */
    };
    for (size_t i = 0; i < sizeof unread / sizeof unread[0]; i++) {
        EXPECT_EQ(p_cuModuleLoadData(&m, unread[i]), CUDA_SUCCESS);
        EXPECT_EQ(p_cuModuleGetFunction(&f, m, "k"), CUDA_SUCCESS);
        EXPECT_EQ(p_cuFuncGetParamInfo(f, 0, &offset, NULL), CUDA_ERROR_NOT_SUPPORTED);
        EXPECT_EQ(p_cuModuleUnload(m), CUDA_SUCCESS);
    }
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc != 2) {
        fprintf(stderr, "usage: image_formats IMAGE_DIR\n");
        return 2;
    }
    cubin = (unsigned char *)test_read_file(argv[1], "simgpu_sleep_sm90.cubin", &cubin_size);
    lib = test_open("TEST_LIBCUDA", "libcuda.so.1");
    test_use_device0(lib);
    malformed_cubins();
    parameter_sections();
    malformed_fatbins();
    texts();
    if (test_failures > 0) {
        printf("FAIL %d\n", test_failures);
        return 1;
    }
    printf("PASS\n");
    return 0;
}
