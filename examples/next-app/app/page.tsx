export default function Home() {
  return (
    <main>
      <h1>ratestore with Next.js</h1>
      <p>
        Rate-limited route handlers: <a href="/api/memory">/api/memory</a> (memoryStore) and{' '}
        <a href="/api/redis">/api/redis</a> (redisStore, needs REDIS_URL).
      </p>
    </main>
  );
}
