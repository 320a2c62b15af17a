// Limited by proxy.ts, like every route under /api.
export function GET(): Response {
  return Response.json({ hello: 'world' });
}
