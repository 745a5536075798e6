// Placeholder so the library has a source until its first real file lands; delete it then.
namespace yolo8 { int data_placeholder() { return 0; } }
