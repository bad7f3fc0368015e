/* An unrelated library that happens to define functions named like CUDA's and curl's: dlsym
 * on its own handle must return these, shim or no shim. */
__attribute__((visibility("default"))) int cuMemAlloc_v2(void)
{
    return 12345;
}

__attribute__((visibility("default"))) int curl_global_init(void)
{
    return 7;
}
