/* vmmckpt's in-process API: a program running under libvmmckpt.so pauses and resumes its own GPU memory.
 *
 * vmmckpt_pause() gives every byte of device memory the shim owns back to the driver (nvidia-smi shows it
 * free) while every address stays reserved; vmmckpt_resume() brings the memory back at the same addresses,
 * with its bytes when the pause kept them in host memory. Between the two, CUDA calls of the program's
 * threads wait for vmmckpt_resume() (as under `cuda-ckpt suspend`), so the thread that paused must call
 * nothing on the GPU before it resumes. The CUDA context itself stays.
 *
 * The functions are exported by libvmmckpt.so. A program that may also run without the shim looks them up
 * with dlsym(RTLD_DEFAULT, "vmmckpt_pause"), as the Python package does. Every function is thread-safe,
 * never throws and never ends the process. docs/python.md describes the Python API built on it.
 */
#ifndef VMMCKPT_VMMCKPT_H
#define VMMCKPT_VMMCKPT_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define VMMCKPT_API_VERSION 3 /* 2: vmmckpt_name; 3: vmmckpt_set_tag, vmmckpt_pause_tagged */

/* vmmckpt_pause flags */
#define VMMCKPT_PAUSE_KEEP 0u    /* copy the bytes to host memory first; resume writes them back */
#define VMMCKPT_PAUSE_DISCARD 1u /* drop the bytes: after resume the memory reads as zeros */

/* Results */
#define VMMCKPT_OK 0
#define VMMCKPT_E_STATE \
  1 /* already paused, not paused, suspended by cuda-ckpt, or other processes map its memory through CUDA IPC */
#define VMMCKPT_E_BUSY 2 /* cuda-ckpt is dumping or suspending this process, or CUDA calls did not return in time */
#define VMMCKPT_E_NO_MEMORY 3 /* not enough host memory for the copy, or GPU memory for resume */
#define VMMCKPT_E_DRIVER 4    /* the CUDA driver failed or is missing (the message says which call) */
#define VMMCKPT_E_INVALID 5   /* an unknown flag */

/* What a pause or a resume did. */
typedef struct vmmckpt_stats {
  uint64_t bytes_released; /* pause: device memory given back to the driver; resume: memory made again */
  uint64_t bytes_copied;   /* bytes copied to host memory (pause) or back to the GPU (resume) */
  double seconds;          /* the call's duration */
} vmmckpt_stats;

/* Pauses this process's GPU memory. stats may be NULL. On failure nothing changed and the program goes on. */
int vmmckpt_pause(unsigned flags, vmmckpt_stats* stats);

/* Tags, as serving programs tag their weights and their KV cache (docs/python.md, "Tags"): every allocation the
 * calling thread makes from now on carries `tag` (1 to 64 printable characters without spaces; NULL or "" for
 * none), until it sets another. Under PyTorch's caching allocator only memory it newly takes from CUDA is tagged:
 * the Python API's vmmckpt.region() gives each tag a memory pool of its own. At most 256 tags. */
int vmmckpt_set_tag(const char* tag);
typedef struct vmmckpt_tag_policy {
  const char* tag;
  unsigned flags; /* VMMCKPT_PAUSE_KEEP or VMMCKPT_PAUSE_DISCARD for that tag's memory */
} vmmckpt_tag_policy;
/* vmmckpt_pause, each tag in `policies` (count of them) as its flags say and the rest of the memory as `flags`. */
int vmmckpt_pause_tagged(unsigned flags, const vmmckpt_tag_policy* policies, unsigned count, vmmckpt_stats* stats);
/* Brings the memory back and lets every thread go on. On failure the process stays paused and the call
 * can be tried again (after freeing GPU memory elsewhere, for example). */
int vmmckpt_resume(vmmckpt_stats* stats);
/* 0 running, 1 paused by vmmckpt_pause, 2 suspended by cuda-ckpt. */
int vmmckpt_state(void);
/* The calling thread's last failure, in words ("" when none). Valid until its next vmmckpt_ call. */
const char* vmmckpt_last_error(void);
/* Names [ptr, ptr + size) of the program's GPU memory, so that `cuda-ckpt peek PID NAME` reads it without its
 * address (docs/peek.md); naming another range so replaces it, and size 0 unnames it. A name is 1 to 128
 * printable characters without spaces, not a number. VMMCKPT_E_INVALID for a bad name or range, or too many names
 * (4096). The range is checked when it is read: it must then lie in memory the shim owns. */
int vmmckpt_name(const void* ptr, uint64_t size, const char* name);
/* VMMCKPT_API_VERSION of the loaded shim. */
int vmmckpt_api_version(void);

#ifdef __cplusplus
}
#endif

#endif /* VMMCKPT_VMMCKPT_H */
